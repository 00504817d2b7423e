"""miles-ray logs: a run's job logs, optionally followed until the job ends."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, job_state_exit
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.cli.views import read_logs
from miles_ray.core.runs import RunLogs
from miles_ray.services.runs import pick_run

FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="stream until the job ends; the exit code tells its state")]


@run_options
def logs_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="run name [default: the latest run]", show_default=False)] = None,
    follow: FollowOpt = False,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Print a run's job logs (from the Ray Jobs API).

    A supervised run (submit --max-restarts): every attempt's logs in order, each after a line
    '== attempt N (<job id>), resumed from <dir> iter I, from rollout I+1 ==' (Miles' numbering: checkpoint I
    holds rollout I trained).

    Once the run's cluster is gone (after 'down'), the copy saved when the run ended or when its cluster went
    down is printed instead, saying so on stderr: every attempt of a supervised run, whole; an attempt whose copy
    could not be saved is named in one error line, and the exit code is then 1.
    A --mode launcher run on Kubernetes is a Polyaxon job: its logs are read through Polyaxon's API (no
    kubeconfig needed).

    With --follow, stream until the job ends and exit with its state: 0 succeeded, 3 failed, 6 stopped.
    If the head goes away while following, say so and exit 1. -o json/yaml prints one document (run,
    status, logs) once the logs end.
    """
    name = pick_run(run, target.namespace)
    text, state = read_logs(name, follow, output, **target.reach())
    if output is not Output.table:
        emit(RunLogs(run=name, status=state, logs=text), output, lambda: None)
    if follow:
        job_state_exit(name, state)
