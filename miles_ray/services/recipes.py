"""The recipe catalog as ``miles-ray recipes`` lists it: the built-in recipes (mirroring the upstream Miles
launchers at one pinned commit) and those of a --recipe-file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import field_serializer

from miles_ray.core.recipes import UPSTREAM_MILES_COMMIT, Recipe, catalog
from miles_ray.core.results import Result


class RecipeCatalog(Result):
    """The commit the built-in recipes mirror, and every recipe (in JSON with its content hash and whether the
    planner can plan it, and why not)."""

    upstream_miles_commit: str
    recipes: list[Recipe]

    @field_serializer("recipes")
    def _recipes(self, recipes: list[Recipe]) -> list[dict[str, Any]]:
        return [r.model_dump(mode="json") | {"hash": r.content_hash(), "plannable": r.plannable,
                                             "not_plannable_reason": r.not_plannable_reason} for r in recipes]


def list_recipes(recipe_file: str | Path | None = None) -> RecipeCatalog:
    """The catalog: the built-in recipes, then those of ``recipe_file``."""
    return RecipeCatalog(upstream_miles_commit=UPSTREAM_MILES_COMMIT, recipes=list(catalog(recipe_file).values()))
