"""``miles-ray init``: write the commented starter configuration (:data:`miles_ray.core.config.STARTER`), whole
or not at all (a temporary file beside it, renamed into place)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from miles_ray.core.config import STARTER
from miles_ray.core.errors import ConfigError
from miles_ray.core.results import Result


class StarterWritten(Result):
    path: str
    written: bool


def write_starter(path: Path, force: bool = False) -> StarterWritten:
    """Write the starter file at ``path`` (an existing file only with ``force``); bad input (a directory, a
    missing parent, a name the filesystem refuses) is a ``ConfigError``."""
    try:
        _write(path, force, STARTER)
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a read-only directory...
        raise ConfigError(f"cannot write {str(path)[:200]!r}: {getattr(e, 'strerror', None) or e}") from None
    return StarterWritten(path=str(path), written=True)


def _write(path: Path, force: bool, text: str) -> None:
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists", hint="pass --force to overwrite it")
    if path.is_dir() or not path.name or path.name in (".", ".."):
        raise ConfigError(f"{path} is a directory; give a file name such as {path / 'miles-ray.yaml'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"directory {parent} does not exist")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".miles-ray-", dir=parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise
