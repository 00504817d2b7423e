"""miles-ray runs outputs RUN: the run's checkpoints -- complete or partial, size, time written, the attempt that
wrote it, the eval metrics logged for it, its registered version, kept or pruned and why."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, out
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.services.outputs import outputs
from miles_ray.services.runs import pick_run


def size(n: int | None) -> str:
    """Bytes for a person (1024-based), ``-`` when not known."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # (not reached)


@run_options
def outputs_cmd(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="the run [default: the latest run]", show_default=False)] = None,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """List a run's checkpoints with what they scored, and which the retention keeps.

    Each checkpoint (Miles' numbering: iteration N holds rollout N trained) is complete or partial (newer than
    latest_checkpointed_iteration.txt, which Megatron writes last, or with files missing), with its size in bytes,
    the time it was written, the attempt that wrote it, the eval metrics logged for it (the eval a job makes
    before training at its first rollout S measured checkpoint S - 1), its registered model version, and whether
    it is kept and why; the checkpoints the run's retention (submit --keep-checkpoints / --keep-best) deleted are
    listed too. Read live (here for the local backend, else through a short probe job on the run's cluster); once
    the cluster is gone, what was last seen, marked as such.

    Examples:

    \b
      miles-ray runs outputs q4-a
      miles-ray runs outputs q4-a -o json
    """
    result = outputs(pick_run(run, target.namespace), **target.reach())

    def table() -> None:
        from rich.table import Table

        seen = "read now" if result.seen.live else "NOT read now: last seen"
        out.print(f"run {result.run}: checkpoints in {result.root} ({seen}: {result.seen.where}); tracker "
                  f"{result.latest if result.latest is not None else '(none)'}; retention: {result.retention}",
                  markup=False)
        t = Table("iter", "state", "size", "bytes", "written", "attempt", "metrics", "registered", "kept", "why",
                  title_justify="left")
        for c in t.columns:
            c.overflow = "fold"
        for row in result.checkpoints:
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in row.metrics.items() if "-" not in k.split("/", 1)[-1])
            t.add_row(str(row.iteration), row.state, size(row.bytes), "-" if row.bytes is None else str(row.bytes),
                      row.written or "-", "-" if row.attempt is None else str(row.attempt), metrics or "-",
                      ", ".join(row.registered) or "-", "yes" if row.kept else "no", row.why)
        if result.checkpoints:
            out.print(t)
        else:
            out.print("no checkpoints yet", markup=False)
        if result.metrics_note:
            out.print(f"note: {result.metrics_note}", markup=False)

    emit(result, output, table)
