"""miles-ray recipes: list the recipe catalog."""

from __future__ import annotations

from rich.table import Table

from miles_ray.cli.common import Output, OutputOpt, RecipeFileOpt, emit, out
from miles_ray.core.recipes import catalog


def recipes_cmd(recipe_file: RecipeFileOpt = None, output: OutputOpt = Output.table) -> None:
    """List the recipes: parallel sizes, GPUs per rollout engine, batch sizes and directories.

    Built-in recipes mirror the upstream Miles launchers; add your own with --recipe-file (YAML:
    'recipes: [ {name: ..., megatron_model_type: ..., hf_dir: ..., megatron_dir: ..., tensor_parallel: ...,
    rollout_gpus_per_engine: ..., attention_heads: ...} ]').
    """
    recipes = catalog(recipe_file)

    def table() -> None:
        t = Table("recipe", "TP", "PP", "CP", "EP", "GPUs/engine", "GBS", "layout", "launcher")
        for r in recipes.values():
            t.add_row(r.name, str(r.tensor_parallel), str(r.pipeline_parallel), str(r.context_parallel),
                      str(r.expert_parallel), str(r.rollout_gpus_per_engine), str(r.global_batch_size),
                      r.default_layout, r.launcher)
        out.print(t)

    emit([r.model_dump(mode="json") | {"hash": r.content_hash()} for r in recipes.values()], output, table)
