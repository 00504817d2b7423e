"""The files of ``runs pull`` on THIS machine: the manifest of a source dir (per regular file its size and sha256;
a symlink is never followed), what DIR already holds, and one file copied into DIR verified: written beside its
place (``<name>.miles-ray-part``) while its sha256 is computed, checked against the manifest's size and sha256,
then renamed into place -- so a file under its own name in DIR is always whole, and a pull cut off anywhere
resumes with the files already there."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
from typing import Any, BinaryIO, Callable

from miles_ray.core.errors import TransferFailed
from miles_ray.core.pull import PART_SUFFIX, PULL_MANIFEST, ManifestEntry

CHUNK = 4 << 20  # 4 MiB per read: the progress moves often, the copy runs at the disk's pace


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _regular_files(root: str) -> list[tuple[str, int]]:
    """(relative ``/`` path, size) of each regular file under ``root``, symlinks not followed."""
    found = []
    for where, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(where, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), st.st_size))
    return found


def source_manifest(root: str, prefix: str, on_file: Callable[[str], None] | None = None) -> list[ManifestEntry]:
    """The manifest of the regular files under ``root``, their paths under ``prefix`` (``iter_0000009/...``)."""
    entries = []
    for rel, size in _regular_files(root):
        if on_file:
            on_file(rel)
        entries.append(ManifestEntry(path=f"{prefix}/{rel}" if prefix else rel, bytes=size,
                                     sha256=sha256_of(os.path.join(root, rel))))
    return entries


def sizes_in(directory: str) -> dict[str, int]:
    """DIR's regular files by relative path (empty: DIR does not exist yet)."""
    return dict(_regular_files(directory)) if os.path.isdir(directory) else {}


def writable_problem(directory: str) -> str | None:
    """Why ``directory`` cannot be made or written (None: it can), without writing anything."""
    path = os.path.abspath(directory)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def copy_verified(source: str | bytes | BinaryIO, directory: str, entry: ManifestEntry,
                  on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy ``source`` (a file's path, the bytes of a file made here, or a stream read to its end: a member of the
    tar a pull pod sends) to ``directory``/``entry.path``, verified against ``entry`` (size and sha256) before it
    takes its name; a mismatch leaves nothing and raises."""
    dest = os.path.join(directory, *entry.path.split("/"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    part = dest + PART_SUFFIX
    h = hashlib.sha256()
    size = 0
    reader = (io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb") if isinstance(source, str)
              else contextlib.nullcontext(source))  # a stream given is its owner's to close
    try:
        with reader as src, open(part, "wb") as out:
            for block in iter(lambda: src.read(CHUNK), b""):
                out.write(block)
                h.update(block)
                size += len(block)
                if on_bytes:
                    on_bytes(len(block))
            out.flush()
            os.fsync(out.fileno())
        if (size, h.hexdigest()) != (entry.bytes, entry.sha256):
            raise TransferFailed(f"{entry.path} changed while it was pulled: {size} bytes, sha256 {h.hexdigest()[:12]}"
                                 f"... copied, the manifest says {entry.bytes} bytes, sha256 {entry.sha256[:12]}...",
                                 hint="run the same command again: the source is read again")
        os.replace(part, dest)
    except BaseException:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise


def write_manifest(directory: str, content: dict[str, Any]) -> str:
    """The pull's own record in DIR (what it holds, from where, each file's size and sha256)."""
    path = os.path.join(directory, PULL_MANIFEST)
    tmp = path + PART_SUFFIX
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path
