"""miles-ray status: a cluster's nodes and GPUs, or a run's job state."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import ConfigOpt, TableOutput, TableOutputOpt, emit, job_state_exit, notices, table_output
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import cluster_status, ray_tools_hint, run_status_line
from miles_ray.services import clusters
from miles_ray.services.runs import pick_run, run_status


@cluster_options
def status_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="a run name: show its job instead of the cluster", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="kubernetes: also ask Ray (via a port-forward to the head) how many nodes are alive and since when it is idle")] = False,
    config: ConfigOpt = None,
    output: TableOutputOpt = TableOutput.table,
) -> None:
    """Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job.

    For the cluster it also says since when it has been idle -- no job pending or running and no active
    driver, from the Ray dashboard's activity API (on Kubernetes with --ray) -- or that it is parked.

    A supervised run (submit --max-restarts) shows its attempts (-o json: ``attempts``, each with started, ended,
    reason, resumed_from): its state is its supervisor's final one, else its current attempt's.

    With RUN, once the run's cluster is gone, the job info saved when the run ended or its cluster went down
    is shown instead, saying so. With RUN the exit code tells the job's state: 0 succeeded, 3 failed, 5 pending or running, 6 stopped
    (--namespace must then be the namespace of the run's cluster).
    """
    output = table_output(output)
    if run:
        info = run_status(pick_run(run, cluster.namespace), kube_context=cluster.context, kubeconfig=cluster.kubeconfig)
        emit(info, output, lambda: run_status_line(info))
        job_state_exit(info.run, info.status)
        return

    cfg = cluster.config(config)
    status = clusters.status(cfg, clusters.backend_for(cfg, cluster.backend.value), with_ray=ray)
    notices(status.to_json())
    emit(status, output, lambda: cluster_status(status))
    if not status.to_json().get("parked"):
        ray_tools_hint(cfg.name, output)
