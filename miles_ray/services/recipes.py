"""The recipe catalog as ``miles-ray recipes`` lists it: the built-in recipes (mirroring the upstream Miles
launchers at one pinned commit) and those of a --recipe-file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import field_serializer

from miles_ray.core.errors import ConfigError, MilesRayError
from miles_ray.core.memory import estimate, parse_size
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import UPSTREAM_MILES_COMMIT, Recipe, catalog
from miles_ray.core.results import Result

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class RecipeCatalog(Result):
    """The commit the built-in recipes mirror, and every recipe (in JSON with its content hash and whether the
    planner can plan it, and why not)."""

    upstream_miles_commit: str
    fits: str | None = None  # set with --fits NxG: only the recipes whose default split that shape can run
    gpu_memory: str | None = None  # with --fits NxG --gpu-memory SIZE: and whose memory estimate fits such GPUs
    recipes: list[Recipe]

    @field_serializer("recipes")
    def _recipes(self, recipes: list[Recipe]) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") | {"hash": r.content_hash(), "plannable": r.plannable,
                                             "not_plannable_reason": r.not_plannable_reason} for r in recipes]


def parse_shape(shape: str) -> tuple[int, int]:
    """``NxG`` (GPU worker nodes x GPUs per node) as two positive numbers; bad input otherwise."""
    m = _SHAPE.match(shape)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"--fits {shape!r} is not NODESxGPUS", hint="e.g. --fits 1x2 (one node of 2 GPUs)")
    return int(m.group(1)), int(m.group(2))


def fits(recipe: Recipe, nodes: int, gpus_per_node: int, gpu_bytes: int | None = None) -> bool:
    """Whether the planner finds ``recipe``'s default split feasible on ``nodes`` x ``gpus_per_node`` (and, with
    ``gpu_bytes``, whether its memory estimate fits GPUs of that size: miles_ray.core.memory)."""
    if not recipe.plannable:
        return False
    try:
        plan = plan_split(recipe, nodes, gpus_per_node, with_suggestions=False)
        if not plan.feasible or gpu_bytes is None:
            return plan.feasible
        return estimate(recipe, plan, gpu_bytes=gpu_bytes).fits
    except MilesRayError:
        return False


def list_recipes(recipe_file: str | Path | None = None, shape: str | None = None,
                 gpu_memory: str | None = None) -> RecipeCatalog:
    """The catalog: the built-in recipes, then those of ``recipe_file``; with ``shape`` (``NxG``) only those whose
    default split is feasible on that many GPU nodes of that many GPUs (with ``gpu_memory`` also fits their
    memory)."""
    gpu_bytes = None
    if gpu_memory is not None:
        gpu_bytes = parse_size(gpu_memory)
        if shape is None:
            raise ConfigError("--gpu-memory goes with --fits NxG", hint="e.g. --fits 1x8 --gpu-memory 80GiB")
    recipes = list(catalog(recipe_file).values())
    if shape is None:
        return RecipeCatalog(upstream_miles_commit=UPSTREAM_MILES_COMMIT, recipes=recipes)
    nodes, gpus = parse_shape(shape)
    return RecipeCatalog(upstream_miles_commit=UPSTREAM_MILES_COMMIT, fits=f"{nodes}x{gpus}", gpu_memory=gpu_memory,
                         recipes=[r for r in recipes if fits(r, nodes, gpus, gpu_bytes)])
