"""miles-ray runs: the runs submitted from this machine, with their provenance ('runs compare' is its own verb
module, cli/compare.py; cli/app.py puts both in the 'runs' group)."""

from __future__ import annotations

from typing import Annotated

import typer

from miles_ray.cli.common import Col, TableOutput, TableOutputOpt, emit, fit_table, out, print_table, table_output
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.core.records import as_record
from miles_ray.services.runs import list_runs


@run_options
def runs_cmd(
    ctx: typer.Context,
    live: Annotated[bool, typer.Option("--live/--no-live", help="ask each run's head for its job state")] = True,
    target: RunFlags = RunFlags(),
    output: TableOutputOpt = TableOutput.table,
) -> None:
    """Run records: list them (the default), compare two.

    Lists the run records (recipe, split, image digest, output dir) and, with --live, each job's state.
    'miles-ray runs compare A B' compares two runs.
    """
    if ctx.invoked_subcommand is not None:
        return
    output = table_output(output)
    namespace = target.namespace
    records = list_runs(namespace=namespace, live=live, **target.reach())

    def table() -> None:
        if not records:
            where = f" on clusters in namespace {namespace!r}" if namespace is not None else ""
            out.print(f"no runs yet{where}: 'miles-ray submit --rehearse --nodes 2' tries one on a local cluster "
                      "('miles-ray up --backend local --nodes 2'); 'miles-ray submit --help' for a real run")
            return
        rows = []
        for row in records:
            r = as_record(row)
            split = r.split or {}
            rows.append([r.run, row.get("status", "-"), str(len(r.attempts)) if r.attempts else "-", r.recipe,
                         f"{split.get('nodes')}x{split.get('gpus_per_node')} {split.get('layout')}", r.mode,
                         r.cluster, r.created, r.output_dir])
        # the run name is never cut ('logs RUN' needs it whole); at narrow widths the output dir, creation time,
        # mode and split go first
        print_table(fit_table([Col("run", key=True), Col("status", keep=9), Col("attempts", keep=8),
                               Col("recipe", keep=7),
                               Col("split", keep=4), Col("mode", keep=3), Col("cluster", keep=6),
                               Col("created", keep=2), Col("output dir", keep=1)], rows))

    emit(records, output, table)
