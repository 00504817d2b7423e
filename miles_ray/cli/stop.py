"""miles-ray stop: stop a run's job."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, out
from miles_ray.services.jobs import latest_run, run_stop


def stop_cmd(
    run: Annotated[Optional[str], typer.Argument(help="run name [default: the latest run]", show_default=False)] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Stop a run's Ray job. Its output dir and checkpoints stay; resume with 'submit --resume-from RUN'."""
    result = run_stop(run or latest_run())
    emit(result, output, lambda: out.print(
        f"run {result['run']}: " + ("stop requested" if result["stopped"] else "job had already ended")))
