"""Recipe catalog: what each Miles launcher recipe needs from the cluster.

A recipe carries the parallel sizes Megatron uses (TP, PP, CP, EP, ETP), the SGLang engine size
(GPUs per rollout engine), batch sizes, the model facts the split rules need (attention heads,
experts) and the directory names the launcher reads. The built-in catalog mirrors the upstream
Miles launchers (``scripts/run_qwen3_dense.py`` and friends); users add their own with a YAML file.

The package's parts, by topic: ``model`` (a recipe's fields and checks), ``builtin`` (the upstream launchers as
recipes) and ``lookup`` (built-in recipes overlaid by a recipe file, one found by name). Import from here.
"""

from __future__ import annotations

from miles_ray.core.recipes.builtin import BUILTIN, DENSE_LAUNCHER
from miles_ray.core.recipes.lookup import RecipeFile, catalog, get_recipe, load_recipe_file
from miles_ray.core.recipes.model import SPLIT_FLAGS, Hardware, Layout, Recipe
from miles_ray.core.upstream_jobs import UPSTREAM_MILES_COMMIT

__all__ = ["BUILTIN", "DENSE_LAUNCHER", "SPLIT_FLAGS", "UPSTREAM_MILES_COMMIT", "Hardware", "Layout", "Recipe",
           "RecipeFile", "catalog", "get_recipe", "load_recipe_file"]
