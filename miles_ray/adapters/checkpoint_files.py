"""The files of a run's checkpoint dir as THIS machine sees them (the local backend: its workers share this
filesystem): per ``iter_<N>`` dir its bytes, file count, time written and what marks it -- by the probe job's own
:func:`describe` (``launchers/list_checkpoints.py``, which runs where the checkpoints are on any other cluster), so
the two listings are one code."""

from __future__ import annotations

import json
import os
from typing import Any

from miles_ray.adapters import state
from miles_ray.core.supervision import REGISTERED_MARKER
from miles_ray.launchers.list_checkpoints import describe


def describe_all(root: str, iterations: list[int]) -> dict[str, dict[str, Any]]:
    """:func:`describe` of each ``iter_<N:07d>`` dir in ``root``, by str(N)."""
    return {str(it): describe(os.path.join(root, f"iter_{it:07d}")) for it in iterations}


def write_registered(path: str, content: dict[str, Any]) -> None:
    """The marker that keeps a registered checkpoint from retention (its supervisor reads it)."""
    tmp = os.path.join(path, f".{REGISTERED_MARKER}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(content, fh, sort_keys=True)
    os.replace(tmp, os.path.join(path, REGISTERED_MARKER))


# -- kept in the run's saved copy (runs/RUN.saved/), read after 'down' ---------------------------------------------

REGISTERED_FILE = "registered.json"  # the model versions 'register' made of the run's checkpoints
OUTPUTS_FILE = "outputs.json"  # the run's checkpoint dir as 'runs outputs' last saw it


def add_registered(run: str, entry: dict[str, Any]) -> None:
    """Keep one registered version of ``run`` (the same iteration and version again replaces it)."""
    path = state.saved_dir(run) / REGISTERED_FILE
    have = [e for e in (state.read_json(path) or []) if (e.get("iteration"), e.get("version")) !=
            (entry.get("iteration"), entry.get("version"))]
    state.atomic_write_json(path, [*have, entry])


def registered(run: str) -> list[dict[str, Any]]:
    return list(state.read_json(state.saved_dir(run) / REGISTERED_FILE) or [])


def save_seen(run: str, seen: dict[str, Any]) -> None:
    state.atomic_write_json(state.saved_dir(run) / OUTPUTS_FILE, seen)


def last_seen(run: str) -> dict[str, Any] | None:
    return state.read_json(state.saved_dir(run) / OUTPUTS_FILE)
