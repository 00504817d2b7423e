"""miles-ray park: free a cluster's GPUs and keep what 'resume' needs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (ConfigOpt, Output, OutputOpt, TimeoutOpt, YesOpt, confirm, emit, progress_display,
                                  warn)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import park_line
from miles_ray.core.durations import parse_duration
from miles_ray.services import clusters


@cluster_options
def park_cmd(
    cluster: ClusterFlags,
    if_idle_for: Annotated[Optional[str], typer.Option("--if-idle-for", metavar="DURATION", help="park only if no job has run and Ray saw no activity for this long (90s, 30m, 2h, 1d); otherwise say why and exit 0 -- for cron or CI", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="park even under a pending or running job (it ends with the pods)")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="kubernetes: return once the pods are gone")] = True,
    yes: YesOpt = False,
    timeout: TimeoutOpt = 300.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Park the cluster: its pods go (GPUs freed), the RayCluster object, claims and checkpoints stay.

    KubeRay: sets spec.suspend (refused when Kueue admits the cluster: Kueue owns suspend there; use 'down').
    Polyaxon: stops the run and keeps its operation. Local backend: stops the processes and keeps the shape.
    Refuses under a pending or running job unless --force. The runs' driver logs are saved first. 'resume'
    brings it back. Asks for confirmation unless --yes or --if-idle-for.
    """
    cfg = cluster.config(config)
    idle_for = parse_duration(if_idle_for, "--if-idle-for") if if_idle_for is not None else None
    chosen = clusters.backend_for(cfg, cluster.backend.value)
    if not yes and idle_for is None and not chosen.on_this_machine:
        confirm(f"park cluster {cfg.name!r} in namespace {cfg.namespace} (its pods are deleted; storage is kept)?",
                refusal=f"refusing to park cluster {cfg.name!r} without confirmation")
    with progress_display(f"parking cluster {cfg.name} ({chosen.name})", timeout=timeout if wait else None) as p:
        result = clusters.park(cfg, chosen, force=force, if_idle_for=idle_for, wait=wait, timeout=timeout, progress=p)
    emit(result, output, lambda: park_line(result))
    for run, why in (result.saved_runs.not_saved if result.saved_runs else {}).items():
        warn(f"could not save the logs of run {run}: {why}")
    for run, why in (result.saved_runs.outputs_not_saved if result.saved_runs else {}).items():
        warn(f"could not keep the checkpoint listing of run {run} ('runs outputs'): {why}")
