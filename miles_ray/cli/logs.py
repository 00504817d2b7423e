"""miles-ray logs: a run's job logs, optionally followed until the job ends."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (ContextOpt, KubeconfigOpt, Output, OutputOpt, RunNamespaceOpt, emit, err,
                                  job_state_exit, pick_run)
from miles_ray.services.jobs import run_logs, run_status

FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends; the exit code tells its state")]


def read_logs(run: str, follow: bool, output: Output, kube_context: str | None = None,
              kubeconfig: str | None = None) -> tuple[str | None, str | None]:
    """(logs, state). As a table the logs stream to stdout as they come (and are not returned); for json/yaml
    they are returned whole. The state is read once the logs end, when following or for json/yaml; after
    following it is also said on stderr."""
    kube = {"kube_context": kube_context, "kubeconfig": kubeconfig}
    text = None

    def saved_copy(where: dict) -> None:
        err.print(f"run {run}: its cluster no longer has the job; reading the saved copy ({where['dir']}, saved "
                  f"{where['saved_at']}: {where['reason']})")

    kube["on_saved_copy"] = saved_copy
    if output is Output.table:
        for chunk in run_logs(run, follow, **kube):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    else:
        text = "".join(run_logs(run, follow, **kube))
    kube.pop("on_saved_copy")
    state = run_status(run, **kube)["status"] if follow or output is not Output.table else None
    if follow:
        err.print(f"run {run}: {state}")
    return text, state


def logs_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="run name [default: the latest run]", show_default=False)] = None,
    follow: FollowOpt = False,
    namespace: RunNamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Print a run's job logs (from the Ray Jobs API).

    Once the run's cluster is gone (after 'down'), the copy saved when the run ended or when its cluster went
    down is printed instead, saying so on stderr.
    A --mode launcher run on Kubernetes is a Polyaxon job: its logs are read through Polyaxon's API (no
    kubeconfig needed).

    With --follow, stream until the job ends and exit with its state: 0 succeeded, 3 failed, 6 stopped.
    If the head goes away while following, say so and exit 1. -o json/yaml prints one document (run,
    status, logs) once the logs end.
    """
    name = pick_run(run, namespace)
    text, state = read_logs(name, follow, output, context, kubeconfig)
    if output is not Output.table:
        emit({"run": name, "status": state, "logs": text}, output, lambda: None)
    if follow:
        job_state_exit(name, state)
