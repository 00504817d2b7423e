"""miles-ray status: a cluster's nodes and GPUs, or a run's job state."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, ContextOpt, KubeconfigOpt, NameOpt, NamespaceOpt,
                                  Output, OutputOpt, config_flags, emit, job_state_exit, notices, out, pick_run)
from miles_ray.cli.up import kube_status_table, nodes_table
from miles_ray.core.config import load_config
from miles_ray.services import clusters
from miles_ray.services.jobs import run_status


def status_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="a run name: show its job instead of the cluster", show_default=False)] = None,
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    ray: Annotated[bool, typer.Option("--ray/--no-ray", help="kubernetes: also ask Ray (via a port-forward to the head) how many nodes are alive")] = False,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show the cluster (nodes alive in Ray, GPUs per node) or, given RUN, that run's job.

    With RUN the exit code tells the job's state: 0 succeeded, 3 failed, 5 pending or running, 6 stopped
    (--namespace must then be the namespace of the run's cluster).
    """
    if run:
        info = run_status(pick_run(run, namespace), kube_context=context, kubeconfig=kubeconfig)
        emit(info, output, lambda: out.print(
            f"run {info['run']}: [bold]{info['status']}[/] (job {info['submission_id']} on {info['address']})"
            + (f"\n{info['message']}" if info.get("message") else "")))
        job_state_exit(info["run"], info["status"])
        return

    cfg = load_config(config_flags(name=name, namespace=namespace, kube_context=context, kubeconfig=kubeconfig), config)
    chosen = clusters.pick_backend(backend.value, cfg)
    status = clusters.status(cfg, chosen, **({} if chosen == "local" else {"with_ray": ray}))
    notices(status)
    emit(status, output, lambda: nodes_table(status) if chosen == "local" else kube_status_table(status))
