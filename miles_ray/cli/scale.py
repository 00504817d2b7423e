"""miles-ray scale: grow or shrink the GPU worker group safely."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import ConfigOpt, Output, OutputOpt, TimeoutOpt, emit, err, progress_display, warn
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import scaled
from miles_ray.services import clusters


@cluster_options
def scale_cmd(
    nodes: Annotated[int, typer.Option("--nodes", "-N", min=0, max=4096, help="GPU worker nodes wanted")],
    cluster: ClusterFlags = ClusterFlags(),
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="kubernetes: wait for the new size to be ready")] = True,
    ray_check: Annotated[bool, typer.Option("--ray-check/--no-ray-check", help="kubernetes: confirm the change in Ray too")] = True,
    force: Annotated[bool, typer.Option("--force", help="shrink even below what a running job needs; resize a cluster Kueue admits (Kueue restarts all of it)")] = False,
    timeout: TimeoutOpt = 300.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Resize the GPU worker group, wait until Ray sees the change, and print the split for the new size.

    Refuses to shrink below the GPU nodes a running job of this cluster needs, unless --force. Under Kueue
    (--queue) a new size is a new Workload: Kueue suspends the whole cluster, head included, and admits it again
    once the new size fits, so that too needs --force (then it waits for Kueue's admission). Refuses a
    RayCluster whose worker replicas KubeRay's in-tree autoscaler owns (spec.enableInTreeAutoscaling: true;
    clusters made by 'up' never turn it on).
    """
    cfg = cluster.config(config)
    chosen = clusters.scale_backend(cfg, cluster.backend.value)
    with progress_display(f"scaling {cfg.name} to {nodes} GPU node(s)",
                          timeout=timeout if chosen.on_this_machine or wait else None) as p:
        result = clusters.scale(cfg, chosen, nodes, progress=p, timeout=timeout, force=force, wait=wait,
                                ray_check=ray_check)
    emit(result, output, lambda: scaled(result))
    if output is Output.table and nodes > 0:
        if result.recommended_split["feasible"]:
            err.print(f"split for {nodes} node(s) ({cfg.recipe}): {' '.join(result.recommended_split['miles_args'])}")
        else:
            warn(result.split_summary)
