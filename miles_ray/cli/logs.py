"""miles-ray logs: a run's job logs, optionally followed until the job ends."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from miles_ray.services.jobs import EXIT_CODES, latest_run, run_logs, run_status


def stream(run: str, follow: bool, quiet: bool = False) -> int:
    """Print the logs; return the exit code for the job's final state."""
    for chunk in run_logs(run, follow):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    state = run_status(run)["status"]
    if not quiet:
        print(f"run {run}: {state}", file=sys.stderr)
    return EXIT_CODES.get(state, 1)


def logs_cmd(
    run: Annotated[Optional[str], typer.Argument(help="run name [default: the latest run]", show_default=False)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends; exit code tells its state")] = False,
) -> None:
    """Print a run's job logs (from the Ray Jobs API). With --follow, stream until the job ends and exit with
    0 succeeded, 1 failed, 4 stopped. If the head goes away while following, say so and exit 1."""
    code = stream(run or latest_run(), follow)
    if follow:
        raise typer.Exit(code)
