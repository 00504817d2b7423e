"""No dead code in the product: vulture, configured in pyproject.toml ([tool.vulture]: paths, min_confidence), with
tools/vulture_whitelist.py (names only a framework reaches), reports nothing but the names listed in PENDING.
Every whitelist entry is still needed, and the check can fail."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from vulture import Vulture

from tests.conftest import REPO

CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["vulture"]
WHITELIST = REPO / "tools" / "vulture_whitelist.py"

# Product names vulture reports that are neither dead nor reached by a framework (used only by tests, or by nothing
# yet): none. A name here would be a decision still to make (delete it and change the tests that use it, or make
# the product use it); the list only shrinks: a name that is no longer reported must leave it.
PENDING: dict[tuple[str, str], str] = {}


def unused(paths: list[Path], exclude: list[str] | None = None) -> list:
    """What vulture reports for ``paths`` with the pyproject configuration."""
    v = Vulture(ignore_names=CONFIG.get("ignore_names"), ignore_decorators=CONFIG.get("ignore_decorators"))
    v.scavenge([str(p) for p in paths], exclude=[*CONFIG.get("exclude", []), *(exclude or [])])
    return v.get_unused_code(min_confidence=CONFIG["min_confidence"])


def key(item) -> tuple[str, str]:
    return Path(item.filename).resolve().relative_to(REPO).as_posix(), item.name


def test_the_configuration_covers_the_product():
    assert {"miles_ray", "launchers", "tools"} <= set(CONFIG["paths"]) and not CONFIG.get("exclude")
    assert CONFIG["min_confidence"] == 60  # vulture's lowest: unused functions, methods, attributes, variables
    assert WHITELIST.is_file() and WHITELIST.parent.name in CONFIG["paths"]


def test_vulture_finds_no_dead_code():
    found = unused([REPO / p for p in CONFIG["paths"]])
    new = [item.get_report() for item in found if key(item) not in PENDING]
    assert not new, ("dead code (delete it; a name only a framework reaches goes to tools/vulture_whitelist.py with "
                     "why):\n" + "\n".join(new))
    gone = sorted(set(PENDING) - {key(item) for item in found})
    assert not gone, f"no longer reported, remove from PENDING: {gone}"


def result_fields() -> set[str]:
    """The field names of every typed result the product defines (every module imported, every Result subclass)."""
    import importlib
    import pkgutil

    import miles_ray
    from miles_ray.core.results import Result

    for mod in pkgutil.walk_packages(miles_ray.__path__, "miles_ray."):
        if not mod.name.endswith("__main__") and not mod.name.startswith("miles_ray.launchers"):
            importlib.import_module(mod.name)  # (launchers are Ray payloads: no results there)
    names: set[str] = set()
    todo = [Result]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("miles_ray."):
            names |= set(cls.model_fields)
    return names


def whitelisted_result_fields() -> list[str]:
    text = WHITELIST.read_text()
    block = text.split("# BEGIN result fields\n", 1)[1].split("# END result fields", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_result_fields_block_is_what_vulture_would_report():
    """Fields of typed results reach users through to_json (pydantic); the whitelist lists exactly those vulture would
    otherwise report, so a field that nothing sets or prints is still caught once it stops being a Result field."""
    reported = {item.name for item in unused([REPO / p for p in CONFIG["paths"]], exclude=[WHITELIST.name])}
    want = [f"_.{name}" for name in sorted(reported & result_fields())]
    assert whitelisted_result_fields() == want, ("replace the block between '# BEGIN result fields' and "
                                                 "'# END result fields' in tools/vulture_whitelist.py with:\n"
                                                 + "\n".join(want))


def test_every_whitelist_entry_is_needed():
    names = {node.attr if isinstance(node, ast.Attribute) else node.id
             for stmt in ast.parse(WHITELIST.read_text()).body if isinstance(stmt, ast.Expr)
             for node in [stmt.value] if isinstance(node, (ast.Attribute, ast.Name))}
    assert len(names) > 40
    reported = {item.name for item in unused([REPO / p for p in CONFIG["paths"]], exclude=[WHITELIST.name])}
    assert not names - reported, f"whitelisted but used (remove from {WHITELIST.name}): {sorted(names - reported)}"


def test_the_check_fails_on_an_unused_function(tmp_path):
    (tmp_path / "mod.py").write_text("def used():\n    return 1\n\n\ndef forgotten():\n    return 2\n\n\nused()\n")
    found = unused([tmp_path])
    assert [(item.name, item.typ, item.first_lineno) for item in found] == [("forgotten", "function", 5)]
