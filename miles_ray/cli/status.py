"""miles-ray status: a cluster's nodes and GPUs, or a run's job state."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import ConfigOpt, Output, OutputOpt, emit, job_state_exit, notices, out
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import kube_status_table, nodes_table, run_status_line
from miles_ray.core.errors import ClusterError
from miles_ray.services import clusters, lifecycle
from miles_ray.services.runs import pick_run, run_status


@cluster_options
def status_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="a run name: show its job instead of the cluster", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="kubernetes: also ask Ray (via a port-forward to the head) how many nodes are alive and since when it is idle")] = False,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job.

    For the cluster it also says since when it has been idle -- no job pending or running and no active
    driver, from the Ray dashboard's activity API (on Kubernetes with --ray) -- or that it is parked.

    With RUN, once the run's cluster is gone, the job info saved when the run ended or its cluster went down
    is shown instead, saying so. With RUN the exit code tells the job's state: 0 succeeded, 3 failed, 5 pending or running, 6 stopped
    (--namespace must then be the namespace of the run's cluster).
    """
    if run:
        info = run_status(pick_run(run, cluster.namespace), kube_context=cluster.context, kubeconfig=cluster.kubeconfig)
        emit(info, output, lambda: run_status_line(info))
        job_state_exit(info.run, info.status)
        return

    cfg = cluster.config(config)
    chosen = lifecycle.pick_backend(cluster.backend.value, cfg)
    parked = lifecycle.parked_record(cfg, chosen)
    if parked is not None:
        emit(parked, output, lambda: out.print(f"cluster {cfg.name}: [bold]parked[/] since {parked['parked_at']}; "
                                               "'miles-ray resume' brings it back"))
        return
    status = clusters.status(cfg, chosen, **({} if chosen == "local" else {"with_ray": ray}))
    notices(status)
    if chosen == "local" or (ray and not status.get("down")):
        try:
            status["idle"] = lifecycle.cluster_idle(cfg, chosen, status if chosen == "local" else None)
        except ClusterError as e:
            status["idle"] = {"idle": None, "reason": str(e).splitlines()[0]}

    def table() -> None:
        nodes_table(status) if chosen == "local" else kube_status_table(status)
        queue = status.get("queue") or {}
        if queue.get("queued"):
            out.print(f"queued: Kueue has not admitted it yet (LocalQueue {queue['queue']}): {queue['reason']}")
        elif status.get("state") == "suspended":
            out.print("parked (spec.suspend: true); 'miles-ray resume' brings it back")
        idle = status.get("idle")
        if idle:
            out.print(f"idle since {idle['since']} ({idle['idle_seconds']:.0f}s): {idle['reason']}" if idle["idle"]
                      else f"busy: {idle['reason']}" if idle["idle"] is False else f"idle: unknown ({idle['reason']})")

    emit(status, output, table)
