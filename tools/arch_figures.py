"""The architecture's figures, counted from the source (issue: backends behind one seam, typed results,
a thin command layer). Prints them; ``tests/unit/test_architecture.py`` holds the limits.

- backend comparisons: comparisons (==, !=, in, not in, is) in services/ and cli/ against a backend's name
  as a string ("local", "kuberay", "polyaxon", "kubernetes") or as an enum member (Backend.local, Via.kuberay...)
- dict results: public functions of services/ whose return annotation is a dict (or a tuple or optional holding one)
- verb-to-verb imports: a module of cli/ importing another verb module of cli/ (shared modules aside)
- record key accesses: string-key accesses of a run-record field (a field of ``RunRecord``, by its alias, and of
  its typed parts: core/records/) in miles_ray/ outside the record's own package core/records/: ``x["field"]`` (read, write, del), ``x.get/pop/setdefault("field")``
  and ``"field" in x``. Counted by name, whatever ``x`` is (a field name used as a key of another dict counts too).
- Ray HTTP modules: product modules (miles_ray/, launchers/) with a string in code (docstrings apart; f-string
  parts too) naming a path of Ray's dashboard HTTP API (``/api/...``; Polyaxon's ``/api/v1/`` apart)
- largest modules: the product's Python modules (miles_ray/, launchers/) by lines, largest first (data files such as
  core/upstream_jobs.json are not Python modules)
- supervision files: product modules (miles_ray/ outside cli/, launchers/) named for it (``*supervis*``) or defining
  a function or class of its rules (a name with ``supervis``, ``restart`` or ``head_lost``)
- Polyaxon resolutions: the distinct ways product code outside the Polyaxon adapter says where a Polyaxon run lives:
  the ``host`` given to each ``PolyaxonApi(...)`` it makes, an attribute by its name (``cfg.polyaxon_host`` and
  ``x.polyaxon_host`` are one way), a call by its text, none given as ``<environment>``
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


RECORD_CLASSES = {"RunRecord"}  # the record (its typed parts' keys, e.g. "status", are too common to count by name)


def record_fields(runs_module: Path) -> set[str]:
    """The field names (aliases where given) of ``RunRecord`` in ``runs_module``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(runs_module.read_text())):
        if isinstance(node, ast.ClassDef) and node.name in RECORD_CLASSES:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    alias = None
                    if isinstance(stmt.value, ast.Call):
                        alias = next((k.value.value for k in stmt.value.keywords if k.arg == "alias"
                                      and isinstance(k.value, ast.Constant)), None)
                    names.add(alias or stmt.target.id)
    return names - {"model_config"}


def _key(node: ast.AST, fields: set[str]) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in fields


def record_key_accesses(paths: list[Path], fields: set[str]) -> list[tuple[str, int, str]]:
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and _key(node.slice, fields):
                key = node.slice.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in {"get", "pop", "setdefault"} and node.args and _key(node.args[0], fields):
                key = node.args[0].value
            elif isinstance(node, ast.Compare) and _key(node.left, fields) \
                    and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                key = node.left.value
            if key is not None:
                found.append((str(p.relative_to(REPO)), node.lineno, key))
    return sorted(found)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _ray_path(text: str) -> bool:
    return any(text[i:].startswith("/api/") and not text[i:].startswith("/api/v1/")
               for i in range(len(text)) if text[i] == "/")


def ray_http_modules(paths: list[Path]) -> list[str]:
    found = []
    for p in paths:
        tree = ast.parse(p.read_text())
        docs = _docstrings(tree)
        if any(isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
               and _ray_path(node.value) for node in ast.walk(tree)):
            found.append(str(p.relative_to(REPO)))
    return found


def largest_modules(paths: list[Path]) -> list[tuple[str, int]]:
    sized = [(str(p.relative_to(REPO)), len(p.read_text().splitlines())) for p in paths if p.suffix == ".py"]
    return sorted(sized, key=lambda item: (-item[1], item[0]))


SUPERVISION_WORDS = ("supervis", "restart", "head_lost")


def supervision_files(paths: list[Path]) -> list[str]:
    found = []
    for p in paths:
        named = "supervis" in p.stem
        defines = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and any(w in node.name.lower() for w in SUPERVISION_WORDS)
                      for node in ast.walk(ast.parse(p.read_text())))
        if named or defines:
            found.append(str(p.relative_to(REPO)))
    return found


def _way(node: ast.AST | None) -> str:
    if node is None:
        return "<environment>"
    if isinstance(node, ast.Attribute):
        return "." + node.attr
    return ast.unparse(node)


def polyaxon_resolutions(paths: list[Path]) -> list[tuple[str, list[str]]]:
    """Each way (see the module doc) with the places (path:line) that use it."""
    ways: dict[str, list[str]] = {}
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "PolyaxonApi")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "PolyaxonApi")):
                host = next((k.value for k in node.keywords if k.arg == "host"), node.args[0] if node.args else None)
                ways.setdefault(_way(host), []).append(f"{p.relative_to(REPO)}:{node.lineno}")
    return sorted(ways.items())


def _record_modules() -> list[Path]:
    """The record's own modules, the one defining ``RunRecord`` first; an older checkout (--repo) kept it in
    core/runs.py."""
    new = PACKAGE / "core" / "records"
    if not new.is_dir():
        return [PACKAGE / "core" / "runs.py"]
    return [new / "run.py", *(p for p in sorted(new.glob("*.py")) if p.name != "run.py")]


def _product() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "launchers").rglob("*.py"))


def figures() -> dict[str, list]:
    record_modules = _record_modules()
    services = sorted((PACKAGE / "services").rglob("*.py"))
    cli = sorted((PACKAGE / "cli").rglob("*.py"))
    return {"backend_comparisons": backend_comparisons(services + cli), "dict_results": dict_results(services),
            "verb_imports": verb_imports(PACKAGE / "cli"),
            "progress_definitions": progress_definitions(sorted(PACKAGE.rglob("*.py"))),
            "record_key_accesses": record_key_accesses(
                [p for p in sorted(PACKAGE.rglob("*.py")) if p not in record_modules], record_fields(record_modules[0])),
            "ray_http_modules": ray_http_modules(_product()),
            "supervision_files": supervision_files([p for p in _product() if (PACKAGE / "cli") not in p.parents]),
            "polyaxon_resolutions": polyaxon_resolutions(
                [p for p in sorted(PACKAGE.rglob("*.py")) if (PACKAGE / "adapters" / "polyaxon_api") not in p.parents])}


def largest_module() -> tuple[str, int]:
    return largest_modules(_product())[0]


def main() -> int:
    """``-v``: each finding; ``--repo DIR``: count another checkout (e.g. a worktree of an older commit)."""
    global REPO, PACKAGE
    verbose = "-v" in sys.argv
    if "--repo" in sys.argv:
        REPO = Path(sys.argv[sys.argv.index("--repo") + 1]).resolve()
        PACKAGE = REPO / "miles_ray"
    for name, items in figures().items():
        print(f"{name}: {len(items)}")
        if verbose:
            for item in items:
                print(f"    {item}")
    path, lines = largest_module()
    print(f"largest_module: {lines} ({path})")
    if verbose:
        for item in largest_modules(_product())[1:6]:
            print(f"    {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
