"""The architecture stays as designed: one-way layers (core <- adapters <- services <- cli), adapters for
different systems independent of each other, verb services independent of each other (import-linter, with the
contracts in pyproject.toml), no first-party import hidden inside a function body (imports in functions are
for heavy third-party libraries only), payloads that import nothing of miles_ray (they run in the image), and the
run controller (miles_ray/controller) standard library only: it is shipped beside the supervisor program."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

from importlinter.cli import lint_imports

from tests.conftest import REPO

PACKAGE = REPO / "miles_ray"
LAUNCHERS = REPO / "launchers"
CONTROLLER = PACKAGE / "controller"
CONTROLLER_CONTRACT = "the run controller is standard library only"


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


# -- the run controller: standard library only ------------------------------------------------------------------

def non_stdlib_imports(source: str) -> list[str]:
    """The modules ``source`` imports that are neither the standard library nor a module of its own directory
    (a relative import; ``shipped``: a sibling imported by name, as the shipped copy does)."""
    tree = ast.parse(source)
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    siblings = {p.stem for p in CONTROLLER.glob("*.py")}
    return sorted({n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"} | siblings})


def test_the_run_controller_imports_only_the_standard_library():
    found = {p.name: bad for p in sorted(CONTROLLER.glob("*.py")) if (bad := non_stdlib_imports(p.read_text()))}
    assert found == {}, "the run controller is shipped where only the standard library is installed"


def test_a_planted_third_party_or_first_party_import_in_the_controller_is_found():
    planted = "import json\nfrom . import rules\nimport ray_http\nimport yaml\nfrom miles_ray.core import errors\n"
    assert non_stdlib_imports(planted) == ["miles_ray.core", "yaml"]


def _planted_tree(root: Path, package: str, controller_source: str) -> Path:
    """A package ``package`` under ``root`` laid out as miles_ray (core, adapters, controller), its controller
    module ``client`` holding ``controller_source``, and a config holding the run controller's contract as
    pyproject.toml declares it (miles_ray renamed)."""
    for sub in ("", "core", "adapters", "services", "cli", "controller"):
        (root / package / sub).mkdir(parents=True, exist_ok=True)
        (root / package / sub / "__init__.py").write_text("")
    (root / package / "core" / "errors.py").write_text("X = 1\n")
    (root / package / "controller" / "client.py").write_text(controller_source)
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["name"].startswith(CONTROLLER_CONTRACT))
    forbidden = [m.replace("miles_ray", package) for m in contract["forbidden_modules"]
                 if m.startswith("miles_ray") or m == "yaml"]  # (the third-party ones this venv has)
    lines = [f'root_package = "{package}"', "include_external_packages = true", "",
             "[[contracts]]", f'name = "{contract["name"]}"', 'type = "forbidden"',
             f'source_modules = ["{package}.controller"]',
             "forbidden_modules = [" + ", ".join(f'"{m}"' for m in forbidden) + "]"]
    config_file = root / "importlinter.toml"
    config_file.write_text("[tool.importlinter]\n" + "\n".join(lines).replace("[[contracts]]",
                                                                               "[[tool.importlinter.contracts]]"))
    return config_file


@pytest.mark.parametrize("source, broken", [
    ("import json\nimport urllib.request\n", False),
    ("from plantedpkg.core import errors\n", True),  # first party outside the controller
    ("import yaml\n", True),  # third party
])
def test_the_controller_contract_fails_on_a_planted_violation(tmp_path, monkeypatch, capsys, source, broken):
    config_file = _planted_tree(tmp_path, "plantedpkg", source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = lint_imports(config_filename=str(config_file), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert (code != 0) == broken, report
    assert ("BROKEN" in report) == broken, report
