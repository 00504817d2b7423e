"""``runs pull``: which checkpoint to bring home, and what of it DIR still needs. Pure (no I/O): the rows of
:func:`miles_ray.core.outputs.checkpoint_rows`, the run's scores and a manifest (per file its size and sha256,
computed where the files are) come in; the chosen checkpoint and the copy plan go out.

The copy plan compares the manifest with what DIR holds (per relative path its size, and its sha256 when the size
matches): a file already there with the same size and sha256 is not copied again (an interrupted pull resumes where
it stopped: a file is renamed into place only once it is whole and verified), a file there with other content, or a
file in DIR that is not in the manifest, is DIR's different content: refused unless ``--force`` (then overwritten;
a file that is not in the manifest is never deleted, it is named).
"""

from __future__ import annotations

import math
import posixpath
from typing import Mapping, Sequence

from miles_ray.core.errors import ConfigError, SpecError
from miles_ray.core.outputs import CheckpointRow
from miles_ray.core.results import Result
from miles_ray.core.supervision import CheckpointScores, best_checkpoint, parse_keep_best
from miles_ray.core.supervision import SpecError as BadMetric

PULL_MANIFEST = ".miles-ray-pull.json"  # written into DIR once a pull is whole: what it holds and from where
PART_SUFFIX = ".miles-ray-part"  # a file being copied (renamed into place once whole and verified)
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's: written beside the pulled iter_<N> (DIR loads as --load)


class ManifestEntry(Result):
    """One file to pull: its path relative to DIR (``/``-separated), size in bytes, sha256 (hex)."""

    path: str
    bytes: int
    sha256: str


class CopyPlan(Result):
    """What DIR needs: ``to_copy`` (missing, or ``differ``: there with other content), ``skip`` (there, same size
    and sha256), ``extra`` (in DIR, not in the manifest)."""

    to_copy: list[ManifestEntry]
    skip: list[ManifestEntry]
    differ: list[str]
    extra: list[str]

    @property
    def conflicts(self) -> list[str]:
        return sorted(self.differ + self.extra)


class Chosen(Result):
    """The checkpoint a pull brings: its row and why this one."""

    row: CheckpointRow
    why: str


def _its(rows: Sequence[CheckpointRow]) -> str:
    return ", ".join(str(r.iteration) for r in rows) or "none"


def choose_checkpoint(run: str, rows: Sequence[CheckpointRow], scores: CheckpointScores, *,
                      iteration: int | None = None, best: str | None = None) -> Chosen:
    """The checkpoint ``runs pull`` brings: ``iteration``, the best complete one by ``best`` (``METRIC`` highest,
    ``min:METRIC`` lowest), else the newest complete one. Bad input (ConfigError, one line): no such checkpoint, one
    deleted by the retention, a partial one, a metric the run never logged or logged for no complete checkpoint on
    disk, no complete checkpoint at all."""
    on_disk = [r for r in rows if r.state == "complete"]
    if iteration is not None and best is not None:
        raise ConfigError("give --iteration N or --best METRIC, not both")
    if iteration is not None:
        row = next((r for r in rows if r.iteration == iteration), None)
        if row is None:
            raise ConfigError(f"run {run} has no checkpoint {iteration} (complete on disk: {_its(on_disk)})")
        if row.state == "deleted":
            raise ConfigError(f"checkpoint {iteration} of run {run} is gone: {row.why} (complete on disk: "
                              f"{_its(on_disk)})")
        if row.state != "complete":
            raise ConfigError(f"checkpoint {iteration} of run {run} is {row.why}: only a complete checkpoint is "
                              f"pulled (complete on disk: {_its(on_disk)})")
        return Chosen(row=row, why=f"--iteration {iteration}")
    if best is not None:
        try:
            metric, mode = parse_keep_best(best)
        except BadMetric as e:
            raise ConfigError(str(e).replace("--keep-best", "--best")) from None
        logged = sorted(it for it, m in scores.metrics.items() if _finite(m.get(metric)))
        if not logged:
            names = sorted({k for m in scores.metrics.values() for k in m if k.startswith("eval/")})
            raise ConfigError(f"run {run} never logged {metric} (its eval metrics: {', '.join(names) or 'none'})")
        top = best_checkpoint([r.iteration for r in on_disk], scores, metric, mode)
        if top is None:
            raise ConfigError(f"no complete checkpoint of run {run} on disk has {metric} logged (logged for "
                              f"checkpoint(s) {', '.join(map(str, logged))}; complete on disk: {_its(on_disk)})")
        value = scores.value(top, metric)
        return Chosen(row=next(r for r in on_disk if r.iteration == top),
                      why=f"the best by {metric} ({'lowest' if mode == 'min' else 'highest'}: {value:.6g})")
    if not on_disk:
        partial = [r for r in rows if r.state == "partial"]
        raise ConfigError(f"run {run} has no complete checkpoint to pull" +
                          (f" (partial: {_its(partial)})" if partial else " (none written yet)"))
    return Chosen(row=on_disk[-1], why="the newest complete checkpoint")


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def safe_path(path: str) -> bool:
    """A manifest path that stays inside DIR: relative, ``/``-separated, no ``..``, no empty part, not ours."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(path) != path:
        return False
    return parts[-1] != PULL_MANIFEST and not parts[-1].endswith(PART_SUFFIX)


def checked_manifest(entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
    """The manifest sorted by path; a path that would leave DIR (or repeats) is refused (it came from elsewhere)."""
    seen: set[str] = set()
    for e in entries:
        if not safe_path(e.path) or e.path in seen or e.bytes < 0:
            raise SpecError(f"the manifest names {e.path!r}: not a file inside the pulled dir")
        seen.add(e.path)
    return sorted(entries, key=lambda e: e.path)


def ours(path: str) -> bool:
    """A file of DIR that a pull made for itself (its manifest, a file being copied): never DIR's content."""
    name = path.rsplit("/", 1)[-1]
    return name == PULL_MANIFEST or name.endswith(PART_SUFFIX)


def copy_plan(manifest: Sequence[ManifestEntry], have: Mapping[str, tuple[int, str | None]]) -> CopyPlan:
    """What DIR needs of ``manifest``. ``have``: DIR's files by relative path, (size, sha256; None when it was not
    read: a size that differs says enough). A pull's own files (:func:`ours`) are not DIR's content."""
    copy: list[ManifestEntry] = []
    skip: list[ManifestEntry] = []
    differ: list[str] = []
    wanted = {e.path for e in manifest}
    for e in checked_manifest(manifest):
        there = have.get(e.path)
        if there is None:
            copy.append(e)
        elif there[0] == e.bytes and there[1] == e.sha256:
            skip.append(e)
        else:
            copy.append(e)
            differ.append(e.path)
    extra = sorted(p for p in have if p not in wanted and not ours(p))
    return CopyPlan(to_copy=copy, skip=skip, differ=differ, extra=extra)


def needs_hash(manifest: Sequence[ManifestEntry], sizes: Mapping[str, int]) -> list[str]:
    """The files of DIR worth hashing: those in the manifest with its size (another size already differs)."""
    want = {e.path: e.bytes for e in manifest}
    return sorted(p for p, size in sizes.items() if want.get(p) == size)


def conflict_line(to: str, plan: CopyPlan, limit: int = 3) -> str:
    """The one line that refuses a DIR with other content."""
    names = plan.conflicts
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    what = []
    if plan.differ:
        what.append(f"{len(plan.differ)} file(s) with other content")
    if plan.extra:
        what.append(f"{len(plan.extra)} file(s) that are not part of it")
    return f"{to} holds {' and '.join(what)} ({shown})"
