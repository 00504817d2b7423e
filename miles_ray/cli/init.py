"""miles-ray init: write a commented starter miles-ray.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, err
from miles_ray.core.errors import ConfigError
from miles_ray.core.config import STARTER


def init_cmd(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="where to write it")] = Path("miles-ray.yaml"),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Write a commented starter configuration file (every key, its default and what it does)."""
    try:
        _write_starter(path, force, STARTER)
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a read-only directory...
        raise ConfigError(f"cannot write {str(path)[:200]!r}: {getattr(e, 'strerror', None) or e}") from None
    emit({"path": str(path), "written": True}, output, lambda: err.print(f"wrote {path}; edit it, then run 'miles-ray plan'"))


def _write_starter(path: Path, force: bool, text: str) -> None:
    import os
    import tempfile

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
