"""miles-ray recipes: list the recipe catalog."""

from __future__ import annotations

from rich.table import Table

from miles_ray.cli.common import Output, OutputOpt, RecipeFileOpt, emit, out
from miles_ray.core.recipes import UPSTREAM_MILES_COMMIT, catalog


def recipes_cmd(recipe_file: RecipeFileOpt = None, output: OutputOpt = Output.table) -> None:
    """List the recipes: parallel sizes, GPUs per rollout engine, batch sizes and directories.

    Built-in recipes mirror the upstream Miles launchers (scripts/run_*.py) at one pinned commit of
    radixark/miles, shown first: direct mode submits what those launchers submit at that commit (model
    architecture flags inlined, every train.py flag, the launcher's runtime env), with the planner's split.
    Recipes whose launcher needs AMD or Ascend NPU hardware are listed and marked; plan and submit refuse them.

    Add your own with --recipe-file (YAML: 'recipes: [ {name: ..., megatron_model_type: ..., hf_dir: ...,
    megatron_dir: ..., tensor_parallel: ..., rollout_gpus_per_engine: ..., attention_heads: ..., model_args:
    [...], train_args: [...]} ]'; see docs/recipes.md). -o json: {"upstream_miles_commit": ..., "recipes": [...]}.
    """
    recipes = catalog(recipe_file)

    def table() -> None:
        out.print(f"built-in recipes mirror radixark/miles {UPSTREAM_MILES_COMMIT}")
        t = Table("recipe", "TP", "PP", "CP", "EP", "GPUs/engine", "GBS", "layout", "hardware", "launcher")
        for r in recipes.values():
            hardware = "nvidia" if r.plannable else f"{r.hardware} (not plannable)"
            t.add_row(r.name, str(r.tensor_parallel), str(r.pipeline_parallel), str(r.context_parallel),
                      str(r.expert_parallel), str(r.rollout_gpus_per_engine), str(r.global_batch_size),
                      r.default_layout, hardware, " ".join([r.launcher, *r.launcher_args]))
        out.print(t)

    emit({"upstream_miles_commit": UPSTREAM_MILES_COMMIT,
          "recipes": [r.model_dump(mode="json") | {"hash": r.content_hash(), "plannable": r.plannable}
                      for r in recipes.values()]}, output, table)
