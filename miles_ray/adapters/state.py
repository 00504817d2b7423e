"""Local state on disk: run records, the bookkeeping of Kubernetes clusters made by ``up``, and where the
local backend keeps its cluster files.

Every write is atomic (temp file in the same directory + fsync + rename), so a reader never sees a
torn file, and writers of one directory are serialised by a file lock.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any, Iterator

from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.records import RunRecord, as_record, read_record


def state_dir() -> Path:
    env = os.environ.get("MILES_RAY_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "miles-ray"


def kept_path(path: Path | str) -> str:
    """``path`` as a record keeps it: relative to the state dir when it lies inside it (so a state dir moved or
    restored elsewhere -- a new machine, a backup -- is read the same), else absolute."""
    p = Path(path)
    try:
        return str(p.relative_to(state_dir()))
    except ValueError:
        return str(p)


def kept_path_now(kept: str, inside: str) -> Path:
    """Where the path a record keeps (``kept``: :func:`kept_path`'s) is now; ``inside``: where it lies inside the
    state dir (e.g. ``supervisors/RUN``). Relative: under the state dir now. Absolute (a record written before
    paths were kept relative): as written while it exists; otherwise, when it ends in ``inside`` -- the old state
    dir being what comes before it -- the same place under the state dir now (the state dir was moved)."""
    p = Path(kept)
    if not p.is_absolute():
        return state_dir() / p
    rel = Path(inside)
    if p.exists() or rel.is_absolute() or len(p.parts) <= len(rel.parts) or p.parts[-len(rel.parts):] != rel.parts:
        return p
    moved = state_dir() / rel
    return moved if moved.exists() else p


def atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as e:
        raise ClusterError(f"state file {path} is unreadable ({e})", hint="move it aside and retry") from None


@contextmanager
def locked(path: Path, timeout: float = 30.0) -> Iterator[None]:
    """Serialise writers of ``path`` (a lock file beside it)."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock")
    try:
        with lock.acquire(timeout=timeout):
            yield
    except Timeout:
        raise ClusterError(f"{path} is locked by another miles-ray process for more than {timeout:.0f}s") from None


def local_clusters_dir() -> Path:
    """Where the local backend (``up --backend local``) keeps one state file per cluster."""
    return state_dir() / "local"


# -- Kubernetes clusters made by 'up' ------------------------------------------------------------

def kube_cluster_path(context: str | None, namespace: str, name: str) -> Path:
    """The bookkeeping of a cluster made by ``up`` on Kubernetes: which RayCluster it is (a Polyaxon operation
    names its RayCluster after the run), and the Polyaxon run behind it."""
    return state_dir() / "clusters" / (context or "current-context") / namespace / f"{name}.json"


def read_kube_cluster(context: str | None, namespace: str, name: str) -> dict[str, Any]:
    """The bookkeeping of cluster ``name``; without one, a RayCluster of that name made directly."""
    rec = read_json(kube_cluster_path(context, namespace, name))
    return rec or {"name": name, "via": "kuberay", "raycluster": name, "namespace": namespace}


def write_kube_cluster(context: str | None, namespace: str, name: str, record: dict[str, Any]) -> None:
    atomic_write_json(kube_cluster_path(context, namespace, name), record)
    kube_down_path(context, namespace, name).unlink(missing_ok=True)  # a cluster of that name exists again


def remove_kube_cluster(context: str | None, namespace: str, name: str) -> None:
    kube_cluster_path(context, namespace, name).unlink(missing_ok=True)


def find_kube_cluster(context: str | None, namespace: str, raycluster: str) -> dict[str, Any] | None:
    """The bookkeeping of the cluster made by ``up`` whose RayCluster is ``namespace/raycluster``, or None."""
    directory = kube_cluster_path(context, namespace, "x").parent
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        if path.name.endswith(".down.json"):
            continue
        rec = read_json(path) or {}
        if rec.get("raycluster") == raycluster:
            return rec
    return None


def kube_down_path(context: str | None, namespace: str, name: str) -> Path:
    """What ``down`` took away of a cluster made through Polyaxon (its run), so ``status`` can still say so."""
    return kube_cluster_path(context, namespace, name).with_name(f"{name}.down.json")


def write_kube_down(context: str | None, namespace: str, name: str, record: dict[str, Any]) -> None:
    atomic_write_json(kube_down_path(context, namespace, name), record)


def read_kube_down(context: str | None, namespace: str, name: str) -> dict[str, Any] | None:
    return read_json(kube_down_path(context, namespace, name))


# -- run records ---------------------------------------------------------------------------------

def runs_dir() -> Path:
    return state_dir() / "runs"


def record_path(run: str) -> Path:
    return runs_dir() / f"{run}.json"


class RunStore:
    """The run records of this machine (``runs/RUN.json`` in the state dir), typed: every record read is upgraded
    from the shape it was written in (:mod:`miles_ray.core.records.upgrade`) and written back in today's, keys it
    does not know kept."""

    @staticmethod
    def load(run: str) -> RunRecord:
        data = read_json(record_path(run))
        if data is None:
            # not found: exit 1, like a cluster that is not found (the exit-code table in core/errors.py)
            raise NotFound(f"no run named {run!r}", hint="'miles-ray runs' lists the runs this machine submitted")
        return read_record(data)

    @staticmethod
    def all() -> list[RunRecord]:
        """Every run record, oldest first."""
        d = runs_dir()
        if not d.is_dir():
            return []
        out = []
        for p in sorted(d.glob("*.json")):
            data = read_json(p)
            if isinstance(data, dict) and "run" in data:
                out.append(read_record(data))
        return sorted(out, key=lambda r: r.created or "")

    @staticmethod
    def by_output_dir(output_dir: str) -> RunRecord | None:
        target = output_dir.rstrip("/")
        return next((r for r in RunStore.all() if (r.output_dir or "").rstrip("/") == target), None)

    @staticmethod
    def save(record: RunRecord | Mapping[str, Any]) -> Path:
        """Write ``record`` whole (replacing what is there: :meth:`update` to change a record another process may
        write too)."""
        rec = as_record(record)
        path = record_path(rec.run)
        with locked(path):
            atomic_write_json(path, rec.dump() if isinstance(record, RunRecord) else dict(record))
        return path

    @staticmethod
    def create(record: RunRecord | Mapping[str, Any]) -> Path:
        """Write a new record; refuse if the run name is taken (two runs never share a name or output dir)."""
        rec = as_record(record)
        path = record_path(rec.run)
        with locked(path):
            existing = read_json(path)
            if existing is not None:
                raise ConfigError(f"run {rec.run!r} already exists (output dir {as_record(existing).output_dir})",
                                  hint="pick another --run name, or --resume-from it to continue its checkpoints")
            other = RunStore.by_output_dir(rec.output_dir)
            if other is not None:
                raise ConfigError(f"output dir {rec.output_dir} already belongs to run {other.run!r}",
                                  hint="two runs never share an output dir; use --resume-from to continue it")
            atomic_write_json(path, rec.dump() if isinstance(record, RunRecord) else dict(record))
        return path

    @staticmethod
    def update(run: str, change: Callable[[RunRecord], RunRecord | None]) -> RunRecord:
        """Read run ``run``'s record, ``change`` it (in place, or return the new one) and write it, the file lock
        held throughout: two processes changing one record never lose each other's change."""
        path = record_path(run)
        with locked(path):
            data = read_json(path)
            if data is None:
                raise NotFound(f"no run named {run!r}", hint="'miles-ray runs' lists the runs this machine submitted")
            record = read_record(data)
            record = change(record) or record
            atomic_write_json(path, record.dump())
        return record


def save_record(record: RunRecord | Mapping[str, Any]) -> Path:
    return RunStore.save(record)


def create_record(record: RunRecord | Mapping[str, Any]) -> Path:
    return RunStore.create(record)


def load_record(run: str) -> dict[str, Any]:
    """The record of ``run`` as written today (upgraded), as a dict: for readers not typed yet (:class:`RunStore`
    gives the typed record)."""
    return RunStore.load(run).dump()


def find_record_by_output_dir(output_dir: str) -> dict[str, Any] | None:
    found = RunStore.by_output_dir(output_dir)
    return found.dump() if found is not None else None


def list_records() -> list[dict[str, Any]]:
    return [r.dump() for r in RunStore.all()]


# -- saved copies of a run's job (they outlive the cluster) --------------------------------------

def saved_dir(run: str) -> Path:
    """Where a run's driver logs and job info are saved, next to its record: ``runs/RUN.saved/``."""
    return runs_dir() / f"{run}.saved"


def saved_attempt_dir(run: str, attempt: int = 1) -> Path:
    """Where one attempt's job of a run is saved: attempt 1 (a run's only job, unless supervised) in
    :func:`saved_dir` itself, attempt N of a supervised run in ``runs/RUN.saved/attempt-N/``."""
    return saved_dir(run) if attempt <= 1 else saved_dir(run) / f"attempt-{attempt}"


def save_run_copy(run: str, job: dict[str, Any], logs: str, reason: str, saved_at: str, attempt: int = 1) -> Path:
    """Save the job info and driver logs (``job.json`` and ``driver.log``) of the run's ``attempt``, replacing an
    older copy of it. ``reason`` says what saved it (the job ended, 'stop', 'down')."""
    d = saved_attempt_dir(run, attempt)
    with locked(d / "job.json"):
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".driver.log.", dir=d)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(logs)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, d / "driver.log")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        atomic_write_json(d / "job.json", {"run": run, "job": job, "saved_at": saved_at, "reason": reason,
                                           "logs_bytes": len(logs.encode())})
    return d


def load_run_copy(run: str, attempt: int = 1) -> dict[str, Any] | None:
    """The saved copy of a run's job (of its ``attempt``): ``{run, job, saved_at, reason, dir, logs}``, or None when
    none was saved."""
    d = saved_attempt_dir(run, attempt)
    meta = read_json(d / "job.json")
    if not isinstance(meta, dict):
        return None
    try:
        logs = (d / "driver.log").read_text(errors="replace")
    except FileNotFoundError:
        logs = ""
    return {**meta, "dir": str(d), "logs": logs}


# -- local clusters parked by 'park' (their processes stopped, their shape kept for 'resume') ---------

def parked_local_path(name: str) -> Path:
    return state_dir() / "local-parked" / f"{name}.json"


def read_parked_local(name: str) -> dict[str, Any] | None:
    return read_json(parked_local_path(name))


def write_parked_local(name: str, record: dict[str, Any]) -> None:
    atomic_write_json(parked_local_path(name), record)


def remove_parked_local(name: str) -> None:
    parked_local_path(name).unlink(missing_ok=True)


# -- the current cluster (the one 'up' made last; every cluster verb's default, like kubectl's context) -----

def current_cluster_path() -> Path:
    return state_dir() / "current-cluster.json"


def read_current_cluster() -> dict[str, Any] | None:
    """The current cluster as :func:`write_current_cluster` kept it, or None (none made yet, or taken down)."""
    data = read_json(current_cluster_path())
    return data if isinstance(data, dict) and data.get("name") else None


def write_current_cluster(record: dict[str, Any]) -> None:
    atomic_write_json(current_cluster_path(), record)


def remove_current_cluster() -> None:
    current_cluster_path().unlink(missing_ok=True)


def local_cluster_names() -> tuple[list[str], list[str]]:
    """(running, parked): the local clusters this machine has state of, by name."""
    running = sorted(p.stem for p in local_clusters_dir().glob("*.json")) if local_clusters_dir().is_dir() else []
    parked_dir = parked_local_path("x").parent
    parked = sorted(p.stem for p in parked_dir.glob("*.json")) if parked_dir.is_dir() else []
    return running, [n for n in parked if n not in running]


def kube_cluster_records() -> list[tuple[str | None, dict[str, Any], bool]]:
    """Every Kubernetes cluster 'up' recorded on this machine: (context or None for the current context,
    record, down). ``down``: only what 'down' kept of it (a Polyaxon-made cluster) is left."""
    root = state_dir() / "clusters"
    out: list[tuple[str | None, dict[str, Any], bool]] = []
    for path in sorted(root.glob("*/*/*.json")) if root.is_dir() else []:
        ctx_dir = path.parent.parent.name
        context = None if ctx_dir == "current-context" else ctx_dir
        down = path.name.endswith(".down.json")
        name = path.name[: -len(".down.json")] if down else path.stem
        if down and path.with_name(f"{name}.json").exists():
            continue  # made again since
        rec = read_json(path)
        if isinstance(rec, dict):
            out.append((context, {"name": name, "namespace": path.parent.name, **rec}, down))
    return out


def kube_token_path(context: str | None, namespace: str, name: str) -> Path:
    """Where 'miles-ray env' writes (0600) the Ray token of Kubernetes cluster ``name`` for Ray's own tools."""
    return kube_cluster_path(context, namespace, name).with_name(f"{name}.token")
