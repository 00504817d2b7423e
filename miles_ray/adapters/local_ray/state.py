"""On-disk state of a local cluster: one JSON file per cluster name, a lock beside it, a temp dir.

``<state dir>/<name>.json`` records what ``up``/``scale`` started (session leaders' PIDs and start
times, ports, the temp dir) -- written before anything else can go wrong, so ``down`` always finds
what to stop. ``<state dir>/<name>.token`` (0600) holds the cluster's Ray token while the cluster exists;
the state records its path and the auth mode, never the token. Ray's own files live in a short ``/tmp/mr-<digest>`` temp dir (Unix socket paths
must stay under 108 bytes). When a node never starts, its ``ray start`` output is kept as
``<state dir>/logs/<name>-<node>.log`` (the path the error names); nothing else survives a failed
``up``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from miles_ray.adapters import ray_auth
from miles_ray.adapters import state as state_store
from miles_ray.core.errors import ConfigError

LOCK_TIMEOUT_SECONDS = 300.0
TEMP_PREFIX = "/tmp/mr-"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name or ""):
        raise ConfigError(
            f"invalid local cluster name {name!r}",
            hint="use 1-40 characters: lower-case letters, digits, '-' or '_'",
        )


def state_path(state_dir: Path, name: str) -> Path:
    """The state file of local cluster ``name`` (it exists while the cluster does)."""
    return Path(state_dir) / f"{name}.json"


def failure_log_path(state_dir: Path, name: str, node: str) -> Path:
    """Where the ``ray start`` output of a node that failed to start is kept (``node``: head, worker-3)."""
    return Path(state_dir) / "logs" / f"{name}-{node}.log"


def remove_failure_logs(state_dir: Path, name: str) -> None:
    for path in (Path(state_dir) / "logs").glob(f"{name}-*.log"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def locked(state_dir: Path, name: str) -> Iterator[None]:
    """Serialise commands on one local cluster (the state file's lock, shared with miles_ray.adapters.state)."""
    with state_store.locked(state_path(state_dir, name), timeout=LOCK_TIMEOUT_SECONDS):
        yield


def token_path(state_dir: Path, name: str) -> Path:
    """The Ray token file of local cluster ``name`` (0600; exists while a token-auth cluster does)."""
    return Path(state_dir) / f"{name}.token"


def new_token(state_dir: Path, name: str) -> Path:
    """A fresh token for a cluster about to start, written 0600; returns its path."""
    return ray_auth.write_token_file(token_path(state_dir, name), ray_auth.new_token())


def remove_token(state_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        token_path(state_dir, name).unlink()


def remember_token(state: dict) -> None:
    """Make the cluster's token go with this process's requests to its dashboard (a no-op without auth)."""
    if state.get("auth") == "token" and state.get("dashboard_url") and state.get("token_path"):
        ray_auth.remember(state["dashboard_url"], ray_auth.read_token_file(state["token_path"]))


def read_state(state_dir: Path, name: str) -> dict | None:
    """The recorded state of local cluster ``name``, or None when there is none (its token, if any, is then
    sent with this process's requests to its dashboard)."""
    state = state_store.read_json(state_path(state_dir, name))
    if state is not None:
        remember_token(state)
    return state


def write_state(state_dir: Path, name: str, data: dict) -> None:
    state_store.atomic_write_json(state_path(state_dir, name), data)


def remove_state(state_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(state_dir, name).unlink()


def new_temp_dir(state_dir: Path, name: str) -> str:
    """A fresh, short temp dir for one head's Ray session files."""
    digest = hashlib.sha1(f"{Path(state_dir).resolve()}/{name}/{time.time_ns()}".encode()).hexdigest()[:8]
    path = f"{TEMP_PREFIX}{digest}"
    Path(path).mkdir(parents=True, exist_ok=False)
    return path


def remove_temp_dir(path: str | None) -> None:
    if path and path.startswith(TEMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)
