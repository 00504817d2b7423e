"""miles-ray status: a cluster's nodes and GPUs, or a run's job state."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, NameOpt, Output, OutputOpt, config_flags, emit,
                                  out)
from miles_ray.cli.up import nodes_table


def status_cmd(
    run: Annotated[Optional[str], typer.Argument(help="a run name: show its job instead of the cluster", show_default=False)] = None,
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job.

    With RUN the exit code tells the job state: 0 succeeded, 1 failed, 3 pending or running, 4 stopped.
    """
    if run:
        from miles_ray.services.jobs import EXIT_CODES, run_status

        info = run_status(run)
        emit(info, output, lambda: out.print(
            f"run {info['run']}: [bold]{info['status']}[/] (job {info['submission_id']} on {info['address']})"
            + (f"\n{info['message']}" if info.get("message") else "")))
        raise typer.Exit(EXIT_CODES.get(info["status"], 1))
    from miles_ray.core.config import load_config
    from miles_ray.services import clusters

    cfg = load_config(config_flags(name=name), config)
    status = clusters.status(cfg, clusters.pick_backend(backend.value, cfg))
    emit(status, output, lambda: nodes_table(status))
