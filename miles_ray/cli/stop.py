"""miles-ray stop: stop a run's job."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, YesOpt, confirm, emit, out
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.services.runs import pick_run, run_stop


@run_options
def stop_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="run name [default: the latest run, after asking]", show_default=False)] = None,
    yes: YesOpt = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="return once the job has ended (as 'ray job stop'), or right after asking")] = True,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="seconds to wait for the job to end")] = 60.0,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Stop a run's Ray job.

    Returns once the job has ended, as 'ray job stop' does (bounded by --timeout; --no-wait returns at once).

    A supervised run (submit --max-restarts): its current attempt's job is stopped first, then its supervisor, then
    any attempt started meanwhile; nothing starts it again (a stopped attempt is never retried).

    Its output dir and checkpoints stay; resume with 'submit --resume-from RUN'. Without RUN it asks before
    stopping the latest run (refusing when there is no terminal to ask on) unless -y.
    """
    reach = target.reach()  # the config is read (and checked) before anything is asked or stopped
    name = pick_run(run, target.namespace)
    if run is None and not yes:
        confirm(f"stop run {name!r} (the latest run)?",
                refusal=f"refusing to stop the latest run {name!r} without confirmation",
                hint="name the run, or pass -y/--yes")
    result = run_stop(name, **reach,
                      wait_timeout=timeout if wait else None)
    emit(result, output, lambda: out.print(
        f"run {result.run}: " + ("job had already ended" if not result.stopped else
                                 f"stopped ({result.status})" if result.status else "stop requested")))
