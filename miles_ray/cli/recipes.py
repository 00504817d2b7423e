"""miles-ray recipes: list the recipe catalog."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Col, RecipeFileOpt, TableOutput, TableOutputOpt, emit, fit_table, out, print_table,
                                  table_output)
from miles_ray.services.recipes import list_recipes


def recipes_cmd(
    fits: Annotated[Optional[str], typer.Option("--fits", help="NODESxGPUS, e.g. 1x2: only the recipes whose default split the planner finds feasible on that many GPU worker nodes of that many GPUs", show_default=False)] = None,
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", metavar="SIZE", help="with --fits: only the recipes whose memory estimate also fits GPUs of this size, e.g. 80GiB", show_default=False)] = None,
    recipe_file: RecipeFileOpt = None,
    output: TableOutputOpt = TableOutput.table,
) -> None:
    """List the recipes: parallel sizes, GPUs per rollout engine, batch sizes and directories.

    Built-in recipes mirror the upstream Miles launchers (scripts/run_*.py) at one pinned commit of
    radixark/miles, shown first: direct mode submits what those launchers submit at that commit (model
    architecture flags inlined, every train.py flag, the launcher's runtime env), with the planner's split.
    Recipes whose launcher needs AMD or Ascend NPU hardware are listed and marked; plan and submit refuse them.
    So are launchers whose layout is not one recipe (it changes with the node count: DeepSeek, GLM-5, ...; or the
    planner cannot express it): -o json gives the reason in "not_planned"; `plan` names it (rule layout-plannable).

    Add your own with --recipe-file (YAML: 'recipes: [ {name: ..., megatron_model_type: ..., hf_dir: ...,
    megatron_dir: ..., tensor_parallel: ..., rollout_gpus_per_engine: ..., attention_heads: ..., model_args:
    [...], train_args: [...]} ]'; see docs/recipes.md). -o json: {"upstream_miles_commit": ..., "recipes": [...]}.
    --fits 1x2 lists only what one node of 2 GPUs can run (then "fits": "1x2" in the JSON).
    """
    output = table_output(output)
    result = list_recipes(recipe_file, fits, gpu_memory)

    def table() -> None:
        out.print(f"built-in recipes mirror radixark/miles {result.upstream_miles_commit}")
        if result.fits is not None:
            memory = f", memory estimate within {result.gpu_memory} GPUs" if result.gpu_memory else ""
            out.print(f"recipes whose default split fits {result.fits} (GPU worker nodes x GPUs per node){memory}: "
                      f"{len(result.recipes)}")
        rows = []
        for r in result.recipes:
            hardware = "nvidia" if r.plannable else (f"{r.hardware} (not plannable)" if r.hardware != "nvidia"
                                                     else "nvidia (listed, not planned)")
            sizes = [str(v) for v in (r.tensor_parallel, r.pipeline_parallel, r.context_parallel,
                                      r.expert_parallel, r.rollout_gpus_per_engine, r.global_batch_size)]
            rows.append([r.name, *(sizes if r.plannable else ["-"] * len(sizes)),
                         r.default_layout if r.plannable else "-", hardware, " ".join([r.launcher, *r.launcher_args])])
        # the recipe name ('--recipe NAME') is never cut; at narrow widths the launcher goes first
        print_table(fit_table([Col("recipe", key=True), *(Col(h, keep=5) for h in ("TP", "PP", "CP", "EP")),
                               Col("GPUs/engine", keep=6), Col("GBS", keep=4), Col("layout", keep=7),
                               Col("hardware", keep=3), Col("launcher", keep=1)], rows))
        for r in result.recipes:
            if not r.plannable:
                out.print(f"  {r.name}: not planned: {r.not_plannable_reason}")

    emit(result, output, table)
