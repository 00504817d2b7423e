"""The catalog as a user sees it: the built-in recipes overlaid by a ``--recipe-file`` (YAML), and one recipe
found by its name."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miles_ray.core.errors import ConfigError, plain
from miles_ray.core.recipes.builtin import BUILTIN
from miles_ray.core.recipes.model import Recipe
from miles_ray.core.safe_yaml import load_yaml_file

class RecipeFile(BaseModel):
    """A user recipe file: ``recipes: [ {name: ..., ...}, ... ]``."""

    model_config = ConfigDict(extra="forbid")
    recipes: list[Recipe] = Field(min_length=1)


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {loc}: {plain(str(first['msg']))}{more}"


def load_recipe_file(path: str | Path) -> dict[str, Recipe]:
    data = load_yaml_file(path, what="recipe file")
    try:
        parsed = RecipeFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, f"recipe file {path}"),
                          hint="see docs/recipes.md for the fields a recipe needs") from None
    out: dict[str, Recipe] = {}
    for r in parsed.recipes:
        if r.name in out:
            raise ConfigError(f"recipe file {path}: recipe {r.name!r} is defined twice")
        out[r.name] = r
    return out


def catalog(recipe_file: str | Path | None = None) -> dict[str, Recipe]:
    """Built-in recipes, overlaid by the user's file (a user recipe may replace a built-in one)."""
    recipes = dict(BUILTIN)
    if recipe_file:
        recipes.update(load_recipe_file(recipe_file))
    return recipes


def get_recipe(name: str, recipe_file: str | Path | None = None) -> Recipe:
    recipes = catalog(recipe_file)
    if name in recipes:
        return recipes[name]
    lowered = {k.lower(): k for k in recipes}
    if name.lower() in lowered:
        return recipes[lowered[name.lower()]]
    import difflib

    close = difflib.get_close_matches(name, list(recipes), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run 'miles-ray recipes' to list them"
    raise ConfigError(f"unknown recipe {name!r}", hint=hint)
