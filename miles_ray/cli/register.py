"""miles-ray register: record a chosen checkpoint of a run as a model version in Polyaxon's registry."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import Output, OutputOpt, emit, out, progress_display
from miles_ray.cli.options import RunFlags, run_options
from miles_ray.services.runs import pick_run
from miles_ray.core.config import load_config
from miles_ray.services.registry import CheckVia, register


@run_options
def register_cmd(
    run: Annotated[str, typer.Argument(metavar="RUN", help="the run whose checkpoint to register", show_default=False)],
    checkpoint: Annotated[int, typer.Option("--checkpoint", min=0, help="checkpoint iteration (Miles' numbering: the rollout id it was saved after): <the run's checkpoint dir (its --save)>/iter_<ITER:07d>", show_default=False)],
    version: Annotated[Optional[str], typer.Option("--version", help="model version name [default: RUN-iter-ITER]", show_default=False)] = None,
    hf_dir: Annotated[Optional[str], typer.Option("--hf-dir", help="the HF export to register with it [default: the run's --save-hf, if any]", show_default=False)] = None,
    tag: Annotated[Optional[list[str]], typer.Option("--tag", help="extra tag (repeatable)", show_default=False)] = None,
    description: Annotated[Optional[str], typer.Option("--description", help="version description [default: run, iteration, source]", show_default=False)] = None,
    check_via: Annotated[CheckVia, typer.Option("--check-via", help="where to look for the checkpoint: auto (local backend: this machine; otherwise a Ray job on the run's cluster), local, cluster")] = CheckVia.auto,
    force: Annotated[bool, typer.Option("--force", help="update the version if it already exists")] = False,
    polyaxon_host: Annotated[Optional[str], typer.Option("--polyaxon-host", help="Polyaxon API URL [default: config or $POLYAXON_HOST]", show_default=False)] = None,
    project: Annotated[Optional[str], typer.Option("--project", help="Polyaxon project [default: polyaxon_project]", show_default=False)] = None,
    target: RunFlags = RunFlags(),
    output: OutputOpt = Output.table,
) -> None:
    """Register checkpoint ITER of RUN as a model version in Polyaxon's model registry.

    The checkpoint must exist (checked on the run's cluster, or on this machine for the local backend);
    otherwise nothing is registered and the existing iterations are listed. The version names its
    artifacts explicitly (the Megatron checkpoint dir and the HF export), links the source run (its
    Polyaxon run when the record has one, else the run name and provenance in its content), and carries
    tags. Registration records a selection; it is not a quality gate.

    Examples:

    \b
      miles-ray register q4-a --checkpoint 40
      miles-ray register q4-a --checkpoint 40 --version qwen3-4b-rl-v1 --tag candidate -o json
    """
    flags = {k: v for k, v in {"polyaxon_host": polyaxon_host, "polyaxon_project": project}.items() if v}
    cfg = load_config(flags, target.config)
    run = pick_run(run, target.namespace)
    with progress_display(f"registering run {run} checkpoint {checkpoint}") as p:
        result = register(cfg, run, checkpoint, version=version, hf_dir=hf_dir, tags=list(tag or []),
                          description=description, check_via=check_via, force=force, progress=p,
                          **target.reach())

    def table() -> None:
        out.print(f"model version [bold]{result.version}[/] {'updated' if result.updated else 'registered'} "
                  f"in {result.project} on {result.host}")
        out.print(f"source run {result.run}"
                  + (f" (Polyaxon run {result.polyaxon_run_uuid})" if result.polyaxon_run_uuid else
                     " (no Polyaxon run: named in the description and content)"))
        for art in result.artifacts:
            out.print(f"  artifact {art.name}: {art.path} ({art.format})")
        if result.hf_dir_note:
            out.print(f"  [yellow]{result.hf_dir_note}[/]")
        out.print(f"  tags: {', '.join(result.tags)}")
        out.print(f"  checked: {result.checked.where}; iterations {result.checked.iterations}")
        out.print(f"[bold]note:[/] {result.note}")
        out.print(f"outputs: {result.outputs} (every checkpoint with its evals; a registered one is never pruned); "
                  f"miles-ray runs pull {result.run} --iteration {checkpoint} --to DIR copies it home", markup=False)

    emit(result, output, table)
