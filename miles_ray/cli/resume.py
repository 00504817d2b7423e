"""miles-ray resume: bring a parked cluster back."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import ConfigOpt, Output, OutputOpt, TimeoutOpt, emit, progress_display
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import resumed
from miles_ray.services import clusters


@cluster_options
def resume_cmd(
    cluster: ClusterFlags,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="kubernetes: wait until the workers are back")] = True,
    ray_check: Annotated[bool, typer.Option("--ray-check/--no-ray-check", help="kubernetes: also wait until every GPU worker has joined Ray (as 'up')")] = True,
    timeout: TimeoutOpt = 600.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Resume a parked cluster and wait until every GPU worker has rejoined Ray.

    KubeRay: clears spec.suspend. Polyaxon: creates the run again from the operation kept by 'park'. Local
    backend: starts the same number of nodes again. A cluster that is not parked is only waited for.
    """
    cfg = cluster.config(config)
    chosen = clusters.backend_for(cfg, cluster.backend.value)
    with progress_display(f"resuming cluster {cfg.name} ({chosen.name})",
                          timeout=timeout if chosen.on_this_machine or wait else None) as p:
        result = clusters.resume(cfg, chosen, wait=wait, ray_check=ray_check, timeout=timeout, progress=p)
    emit(result, output, lambda: resumed(result))
