"""The Polyaxon reporter's own files, exactly once across a restart (standard library only; shipped beside the
supervisor with ``polyaxon_report.py``): where they are written, traceml's synchronous writers behind the interface of
its threaded ones, and the journal -- the characters of each attempt's log written and the files' sizes at the last
commit -- that a reporter started again cuts its files back to before it reads the attempts' logs past the offsets."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping


def work_dir(given: str | None, uuid: str) -> str:
    """Where the run's event and log files are written before upload: ``work_dir``, else ``polyaxon/`` in the
    supervisor's directory (its working directory), else a temp dir."""
    for base in (given, "polyaxon"):
        if base:
            try:
                os.makedirs(os.path.join(base, uuid), exist_ok=True)
                return os.path.abspath(os.path.join(base, uuid))
            except OSError:
                continue
    return os.path.join(tempfile.mkdtemp(prefix="miles-ray-polyaxon-"), uuid)


class Synchronous:
    """traceml's synchronous ``EventWriter`` / ``LogWriter`` behind the interface its threaded file writers offer
    (``add_event(s)``, ``flush``, ``close``): events are kept in memory until :meth:`flush` appends them."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def add_event(self, event: Any) -> None:
        self.writer.write(event)

    def add_events(self, events: list[Any]) -> None:
        self.writer.write(events)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


JOURNALED = ("plxlogs", "events")  # the reporter's own files under its work dir (traceml's layout)


def sizes(path: str) -> dict[str, int]:
    """The size of every file the reporter writes under ``path``, by path relative to it."""
    sizes = {}
    for top in JOURNALED:
        for root, _dirs, files in os.walk(os.path.join(path, top)):
            for name in files:
                full = os.path.join(root, name)
                sizes[os.path.relpath(full, path)] = os.path.getsize(full)
    return sizes


def restore(path: str, committed: Mapping[str, int]) -> None:
    """Cut the reporter's files back to what was committed: a file longer than its recorded size loses its tail (lines
    written after the last commit, which the log offsets do not count: they are read and written again), a file
    the record does not name is removed (it was created after the commit)."""
    for rel, size in sizes(path).items():
        full = os.path.join(path, rel)
        want = committed.get(rel)
        if want is None:
            os.remove(full)
        elif size > want:
            os.truncate(full, want)


def read_journal(path: str) -> tuple[dict[int, int], dict[str, int] | None]:
    """(characters of each attempt's log written, sizes of the files then) as :meth:`PolyaxonReporter.commit`
    recorded them; ({}, None) without a record. A record of an earlier reporter (offsets only, no sizes) gives its
    offsets and None: its files are left as they are."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        if isinstance(data, dict) and data.get("version") == 2:
            return ({int(k): int(v) for k, v in data["attempts"].items()},
                    {str(k): int(v) for k, v in data["files"].items()})
        return {int(k): int(v) for k, v in data.items()}, None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}, None
