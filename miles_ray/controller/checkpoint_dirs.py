"""A run's checkpoint directories as the supervisor's retention sees and deletes them (standard library only,
shipped beside the supervisor program): the ``iter_<N>`` directories right inside the run's checkpoint dir, their
files' signature (written again or not) and size, and a deletion that never reaches outside that dir."""

from __future__ import annotations

import os


def iteration_dirs(root: str | None) -> dict[int, str]:
    """The ``iter_<N>`` directories right inside ``root`` (never a symlink: what it points to is outside the run's
    own dir), by iteration."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(root) if root else []
    except OSError:
        return out
    for name in names:
        path = os.path.join(root or "", name)
        if name.startswith("iter_") and name[5:].isdigit() and os.path.isdir(path) and not os.path.islink(path):
            out[int(name[5:])] = path
    return out


def _files(path: str) -> list[tuple[str, int, int]]:
    out = []
    for where, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(where, name))
            except OSError:
                continue
            out.append((os.path.relpath(os.path.join(where, name), path), st.st_size, st.st_mtime_ns))
    return sorted(out)


def signature(path: str) -> tuple[tuple[str, int, int], ...]:
    """A checkpoint dir's files (path, size, mtime): another one means it was written again."""
    return tuple(_files(path))


def size(path: str) -> int:
    return sum(n for _, n, _ in _files(path))


def inside(root: str, path: str) -> bool:
    """Whether ``path`` is a real directory right inside ``root`` (not a symlink, not elsewhere)."""
    return os.path.dirname(os.path.realpath(path)) == os.path.realpath(root) and not os.path.islink(path)
