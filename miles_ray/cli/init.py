"""miles-ray init: write a commented starter miles-ray.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, err
from miles_ray.services.init import write_starter


def init_cmd(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="where to write it")] = Path("miles-ray.yaml"),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Write a commented starter configuration file (every key, its default and what it does)."""
    result = write_starter(path, force)
    emit(result, output, lambda: err.print(f"wrote {path}; edit it, then run 'miles-ray plan'"))
