"""miles-ray runs compare A B: two runs side by side -- provenance, split, evaluation data, final metrics."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, out
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.services.runs import pick_run
from miles_ray.services.compare import compare


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    s = str(v)
    return s if len(s) <= 72 else s[:69] + "..."


def _best(c) -> str:
    """A run's best checkpoint as the table shows it: ``7 (eval/aime 0.31)``."""
    if c.best is None:
        return "-"
    return f"{c.best} ({c.metric} {_fmt(c.value)})" if c.value is not None else str(c.best)


def folded(table):
    """A value that does not fit folds onto the next line instead of ending in '…' (a path stays whole)."""
    for column in table.columns:
        column.overflow = "fold"
    return table


@run_options
def compare_cmd(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="the first run to compare", show_default=False)],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="the second run to compare", show_default=False)],
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Compare two runs: recipe and its hash, split, image digest, Miles commit, model/dataset revisions,
    output dirs, the evaluation data and procedure, the last value of each metric Miles logged
    (eval/<dataset>, rollout/raw_reward, train/loss ... read from the job logs), and each run's newest complete
    and best checkpoint (by its --keep-best metric, else its first eval metric) as its saved outputs listing
    has them ('miles-ray runs outputs RUN' reads and saves one).

    It names the run with the better final eval metric only when both used the same evaluation data,
    dataset revision and procedure; otherwise it shows the numbers and says why it will not judge. Even
    then, a better metric is not by itself proof of a better model.
    """
    from rich.table import Table

    result = compare(pick_run(run_a, target.namespace), pick_run(run_b, target.namespace),
                     **target.reach())

    def table() -> None:
        a, b = result.a, result.b
        if 4 * 3 + 1 + 16 + len("differs") + len(a) + len(b) > out.width:
            # the run names do not fit as column headers: name them once, whole, and head the columns A and B
            out.print(f"A: {a}\nB: {b}")
            a, b = "A", "B"
        t = folded(Table("", a, b, "", title="runs", title_justify="left"))
        for row in result.provenance + result.split:
            if row.a is None and row.b is None:
                continue
            t.add_row(row.field, _fmt(row.a), _fmt(row.b), "" if row.same else "[yellow]differs[/]")
        out.print(t)
        ev = result.eval
        t = folded(Table("", a, b, title="evaluation", title_justify="left"))
        t.add_row("eval data", ", ".join(f"{k}={v}" for k, v in ev.a.data.items()) or "-",
                  ", ".join(f"{k}={v}" for k, v in ev.b.data.items()) or "-")
        t.add_row("dataset revision", _fmt(ev.a.dataset_revision), _fmt(ev.b.dataset_revision))
        for k in sorted(set(ev.a.procedure) | set(ev.b.procedure)):
            t.add_row(k, _fmt(ev.a.procedure.get(k)), _fmt(ev.b.procedure.get(k)))
        out.print(t)
        t = folded(Table("final metric (last logged value)", a, b, title="metrics", title_justify="left"))
        for row in result.metrics:
            t.add_row(row.metric, _fmt(row.a) + (f" @{row.a_at}" if row.a_at is not None else ""),
                      _fmt(row.b) + (f" @{row.b_at}" if row.b_at is not None else ""))
        out.print(t)
        t = folded(Table("checkpoint (saved outputs listing)", a, b, title="checkpoints", title_justify="left"))
        ca, cb = result.checkpoints.a, result.checkpoints.b
        t.add_row("newest complete", _fmt(ca.newest), _fmt(cb.newest))
        t.add_row("best", _best(ca), _best(cb))
        t.add_row("", ca.note, cb.note)
        out.print(t)
        for run, why in result.errors.items():
            out.print(f"[yellow]{run}: no metrics: {why}[/]")
        v = result.verdict
        out.print(("[bold]" if not v.refused else "[yellow]") + v.statement + "[/]")
        if not v.refused:
            out.print(f"note: {v.caveat}")

    emit(result, output, table)
