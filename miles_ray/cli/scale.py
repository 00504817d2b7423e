"""miles-ray scale: grow or shrink the GPU worker group safely."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, ContextOpt, KubeconfigOpt, NameOpt, NamespaceOpt,
                                  Output, OutputOpt, TimeoutOpt, config_flags, emit, err, progress_display, warn)
from miles_ray.cli.views import kube_status_table, nodes_table
from miles_ray.core.prepare import resolve_plan
from miles_ray.core.config import load_config
from miles_ray.core.planner import summary_line
from miles_ray.services import clusters
from miles_ray.services.lifecycle import refuse_scale_if_autoscaled


def scale_cmd(
    nodes: Annotated[int, typer.Option("--nodes", "-N", min=0, max=4096, help="GPU worker nodes wanted")],
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
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
    cfg = load_config(config_flags(name=name, namespace=namespace, kube_context=context, kubeconfig=kubeconfig), config)
    chosen = clusters.pick_backend(backend.value, cfg)
    if chosen != "local":
        refuse_scale_if_autoscaled(cfg)
    with progress_display(f"scaling {cfg.name} to {nodes} GPU node(s)",
                          timeout=timeout if chosen == "local" or wait else None) as p:
        kube = {} if chosen == "local" else {"wait": wait, "ray_check": ray_check}
        status = clusters.scale(cfg, chosen, nodes, progress=p, timeout=timeout, force=force, **kube)
    if nodes > 0:
        # the split for the cluster as it was made (its workers' GPUs), not for the configured default
        gpn = status.get("gpus_per_worker") or status.get("gpus_per_node") or cfg.gpus_per_node
        _, plan = resolve_plan(cfg.model_copy(update={"nodes": nodes, "gpus_per_node": gpn}))
        status["recommended_split"] = plan.model_dump(mode="json", include={"feasible", "layout", "miles_args", "errors"})
    emit(status, output, lambda: nodes_table(status) if chosen == "local" else (
        kube_status_table(status) if "pods" in status else err.print(f"scaled {cfg.name} to {nodes}")))
    if output is Output.table and nodes > 0:
        if plan.feasible:
            err.print(f"split for {nodes} node(s) ({cfg.recipe}): {' '.join(plan.miles_args)}")
        else:
            warn(summary_line(plan))
