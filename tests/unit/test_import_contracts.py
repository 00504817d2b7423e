"""The architecture stays as designed: one-way layers (core <- adapters <- services <- cli), adapters for
different systems independent of each other, verb services independent of each other (import-linter, with the
contracts in pyproject.toml), no first-party import hidden inside a function body (imports in functions are
for heavy third-party libraries only), and payloads that import nothing of miles_ray (they run in the image)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from importlinter.cli import lint_imports

from tests.conftest import REPO

PACKAGE = REPO / "miles_ray"
LAUNCHERS = REPO / "launchers"


def function_level_imports(source: str, prefix: str = "miles_ray") -> list[tuple[int, str]]:
    """(line, module) of every import of ``prefix`` made inside a function body (or a lambda)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, ast.ImportFrom) and (child.level or (child.module or "").startswith(prefix)):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            elif in_function and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names if a.name.startswith(prefix))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def test_contracts_are_declared_and_kept(capsys):
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["name"]: c for c in config["contracts"]}
    layers = [c for c in contracts.values() if c["type"] == "layers"]
    assert [c["layers"] for c in layers] == [["miles_ray.cli", "miles_ray.services", "miles_ray.adapters",
                                              "miles_ray.core"]]
    systems = {"miles_ray.adapters.kube", "miles_ray.adapters.polyaxon_api", "miles_ray.adapters.ray_jobs",
               "miles_ray.adapters.local_ray"}
    assert any(systems <= set(c["modules"]) for c in contracts.values() if c["type"] == "independence")
    code = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert code == 0, report
    assert f"Contracts: {len(contracts)} kept, 0 broken." in report


def test_the_scan_finds_a_function_level_import():
    source = "import os\nfrom miles_ray.core import errors\n\ndef f():\n    from miles_ray.services import jobs\n" \
             "    import miles_ray.adapters.kube\n    from . import sibling\n    import ray\n"
    assert function_level_imports(source) == [(5, "miles_ray.services"), (6, "miles_ray.adapters.kube"),
                                              (7, ".")]


def test_no_first_party_import_inside_a_function():
    found = {str(p.relative_to(REPO)): hits for p in sorted(PACKAGE.rglob("*.py"))
             if (hits := function_level_imports(p.read_text()))}
    assert found == {}, "imports inside functions are for heavy third-party libraries only"


def test_payloads_import_nothing_of_miles_ray():
    """launchers/ run as Ray jobs inside the image, where miles-ray is not installed."""
    for p in sorted(LAUNCHERS.glob("*.py")):
        tree = ast.parse(p.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.startswith("miles_ray")], p.name
