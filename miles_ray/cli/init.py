"""miles-ray init: write a commented starter miles-ray.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_ray.cli.common import err
from miles_ray.core.errors import ConfigError


def init_cmd(
    path: Annotated[Path, typer.Argument(help="where to write it")] = Path("miles-ray.yaml"),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write a commented starter configuration file (every key, its default and what it does)."""
    import os
    import tempfile

    from miles_ray.core.config import STARTER

    if path.exists() and not force:
        raise ConfigError(f"{path} already exists", hint="pass --force to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".miles-ray-", dir=parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(STARTER)
    os.replace(tmp, path)
    err.print(f"wrote {path}; edit it, then run 'miles-ray plan'")
