"""miles-ray runs pull RUN --to DIR: one complete checkpoint (or the eval results) of a run copied home, verified."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, err, out, progress_display
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.services.pull import pull
from miles_ray.services.runs import pick_run


class _Bar:
    """The copy's progress bar on stderr: bytes copied, speed and time left (Rich), made once the size is known."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def start(self, total: int, files: int) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        if not files:
            return
        self.progress = Progress(TextColumn("copying {task.fields[files]} file(s)"), BarColumn(), DownloadColumn(binary_units=True),
                                 TransferSpeedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err)
        self.progress.start()
        self.task = self.progress.add_task("copy", total=total, files=files)

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=n)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@run_options
def pull_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="the run [default: the latest run]", show_default=False)] = None,
    to: Annotated[str, typer.Option("--to", metavar="DIR", help="where to copy it (made if missing)", show_default=False)] = ...,
    iteration: Annotated[Optional[int], typer.Option("--iteration", metavar="N", min=0, help="checkpoint N (Miles' numbering: iter_<N:07d>) [default: the newest complete one]", show_default=False)] = None,
    best: Annotated[Optional[str], typer.Option("--best", metavar="METRIC", help="the complete checkpoint with the best METRIC (the highest; min:METRIC the lowest)", show_default=False)] = None,
    evals: Annotated[bool, typer.Option("--evals", help="pull the eval results (evals.json: the eval metrics of each checkpoint) instead of a checkpoint")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite files of DIR that hold other content (a file not part of the pull is never deleted)")] = False,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Copy one complete checkpoint (or the eval results) of a run to DIR, verified, resuming an interrupted copy.

    The checkpoint is the newest complete one, --iteration N, or --best METRIC (see 'miles-ray runs outputs RUN').
    It lands as Megatron keeps it, so DIR loads with --load DIR: DIR/iter_<N:07d>/ and
    DIR/latest_checkpointed_iteration.txt. Each file is checked against the size and sha256 computed where it is
    read, and takes its name only once whole and verified; run the same command again after an interruption and
    the files already in DIR (same size and sha256) are not copied again. A DIR that holds other content is refused
    unless --force. --evals writes DIR/evals.json (the eval metrics the run logged for each checkpoint, every
    attempt's). DIR/.miles-ray-pull.json records what was pulled, from where, and each file's sha256.

    On the embedded (local) cluster the files are copied on this machine. On Kubernetes (KubeRay, and a Polyaxon-made
    cluster whose checkpoints are on its claim) a short-lived pod mounts the run's claim read-only in the cluster's
    pinned image, computes each file's size and sha256 there and streams the files as a tar; it is deleted at the
    end, also on an error, Ctrl-C or kill (a pod left by kill -9 ends by itself once idle).

    Examples:

    \b
      miles-ray runs pull q4-a --to ./q4-a-newest
      miles-ray runs pull q4-a --best eval/aime --to ./q4-a-best
      miles-ray runs pull q4-a --iteration 39 --to ./q4-a-39 -o json
      miles-ray runs pull q4-a --evals --to ./q4-a-evals
    """
    bar = _Bar()
    name = pick_run(run, target.namespace)
    try:
        with progress_display(f"pulling from run {name} to {to}") as p:
            def meter(total: int, files: int) -> None:
                p.hand_over()  # the bar (bytes, speed, time left) takes over stderr's live display
                bar.start(total, files)

            result = pull(name, to, iteration=iteration, best=best, evals=evals, force=force, progress=p,
                          meter=meter, on_bytes=bar.advance, **target.reach())
    finally:
        bar.stop()

    def table() -> None:
        what = "the eval results" if result.what == "evals" else f"checkpoint {result.iteration}"
        out.print(f"run {result.run}: {what} ({result.why}) in {result.to}", markup=False)
        out.print(f"  {result.files} file(s), {result.bytes} bytes, each verified (size + sha256): "
                  f"{result.copied_files} copied ({result.copied_bytes} bytes), {result.skipped_files} already there",
                  markup=False)
        out.print(f"  from {result.source}; manifest: {result.manifest}", markup=False)
        if result.overwritten:
            out.print(f"  overwritten (--force): {', '.join(result.overwritten)}", markup=False)
        if result.left:
            out.print(f"  left in place, not part of it: {', '.join(result.left)}", markup=False)

    emit(result, output, table)
