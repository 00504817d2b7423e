"""The architecture's figures, counted from the source (issue: backends behind one seam, typed results,
a thin command layer). Prints them; ``tests/unit/test_architecture.py`` holds the limits.

- backend comparisons: comparisons (==, !=, in, not in, is) in services/ and cli/ against a backend's name
  as a string ("local", "kuberay", "polyaxon", "kubernetes") or as an enum member (Backend.local, Via.kuberay...)
- dict results: public functions of services/ whose return annotation is a dict (or a tuple or optional holding one)
- verb-to-verb imports: a module of cli/ importing another verb module of cli/ (shared modules aside)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "miles_ray"
BACKEND_NAMES = {"local", "kuberay", "polyaxon", "kubernetes"}
CLI_SHARED = {"app", "common", "options", "views", "__init__"}  # cli modules that are not verbs


def _names_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value in BACKEND_NAMES:
        return True
    if isinstance(node, ast.Attribute) and node.attr in BACKEND_NAMES:
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_backend(e) for e in node.elts)
    return False


def backend_comparisons(paths: list[Path]) -> list[tuple[str, int]]:
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Compare) and any(_names_backend(n) for n in [node.left, *node.comparators]):
                found.append((str(p.relative_to(REPO)), node.lineno))
    return found


def _is_dict(annotation: ast.AST | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.split("[")[0].strip() in {"dict", "Dict"}
    if isinstance(annotation, ast.BinOp):  # X | None
        return _is_dict(annotation.left) or _is_dict(annotation.right)
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    if isinstance(target, ast.Name) and target.id == "tuple" and isinstance(annotation, ast.Subscript):
        elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        return any(_is_dict(e) for e in elts)
    return isinstance(target, ast.Name) and target.id in {"dict", "Dict"}


def dict_results(paths: list[Path]) -> list[tuple[str, str]]:
    found = []
    for p in paths:
        tree = ast.parse(p.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_") \
                    and _is_dict(node.returns):
                found.append((str(p.relative_to(REPO)), node.name))
    return found


def verb_imports(cli_dir: Path) -> list[tuple[str, str]]:
    verbs = {p.stem for p in cli_dir.glob("*.py")} - CLI_SHARED
    found = []
    for p in sorted(cli_dir.glob("*.py")):
        if p.stem not in verbs:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            for m in mods:
                if m.startswith("miles_ray.cli.") and m.split(".")[2] in verbs and m.split(".")[2] != p.stem:
                    found.append((p.stem, m.split(".")[2]))
    return sorted(set(found))


def progress_definitions(paths: list[Path]) -> list[str]:
    found = []
    for p in paths:
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "Progress"
                                                    for t in node.targets):
                found.append(str(p.relative_to(REPO)))
    return found


def figures() -> dict[str, list]:
    services = sorted((PACKAGE / "services").rglob("*.py"))
    cli = sorted((PACKAGE / "cli").rglob("*.py"))
    return {"backend_comparisons": backend_comparisons(services + cli), "dict_results": dict_results(services),
            "verb_imports": verb_imports(PACKAGE / "cli"),
            "progress_definitions": progress_definitions(sorted(PACKAGE.rglob("*.py")))}


def main() -> int:
    verbose = "-v" in sys.argv
    for name, items in figures().items():
        print(f"{name}: {len(items)}")
        if verbose:
            for item in items:
                print(f"    {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
