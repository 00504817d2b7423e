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


# -- methods, by their class ---------------------------------------------------------------------------------------
# vulture matches by name: a method is "used" when any attribute of that name is read anywhere, so
# ``KubeSupervisor.final`` once passed because another class reads its own ``self.final``. This rule reads a method
# by its class: ``self.m`` / ``cls.m`` counts for the classes of the reading class's hierarchy (by base name) only;
# ``X.m`` on an imported name counts for the product's class X (for none when X is a module: ``supervisors.final`` is
# a function, not a method); ``x.m`` on anything else (its type unknown), ``getattr(x, "m")`` and a name in
# tools/vulture_whitelist.py count for every class. Dunder methods and the configured ignore_names /
# ignore_decorators are left out.

SELF_NAMES = {"self", "cls"}


def _hierarchies(trees: list[ast.AST]) -> dict[str, str]:
    """Class name -> one representative of its hierarchy (classes joined with their bases, by name)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                    if name:
                        parent[find(node.name)] = find(name)
                find(node.name)
    return {name: find(name) for name in list(parent)}


def _uses(tree: ast.AST, uses_anywhere: set[str], self_uses: set[tuple[str, str]], classes: set[str]) -> None:
    imported = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}

    def visit(node: ast.AST, cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            cls = node.name
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver in SELF_NAMES and cls is not None:
                self_uses.add((cls, node.attr))
            elif receiver in imported:
                if receiver in classes:
                    self_uses.add((receiver, node.attr))
            else:
                uses_anywhere.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"} \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            uses_anywhere.add(str(node.args[1].value))
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(tree, None)


def qualified_whitelist(whitelist: Path = WHITELIST) -> dict[str, str]:
    """The methods a framework calls on their class, ``{"Class.method": why}``: the one dict expression of
    tools/vulture_whitelist.py (vulture reads no name from it)."""
    [entries] = [stmt.value for stmt in ast.parse(whitelist.read_text()).body
                 if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Dict)]
    return ast.literal_eval(entries)


# Methods the rule reports that are neither dead nor reached by a framework (as PENDING above: a decision still to
# make; the list only shrinks).
PENDING_METHODS: dict[tuple[str, str], str] = {
    ("miles_ray/adapters/polyaxon_api/tracked.py", "TrackedRuns.lineage"):
        "read only by tests (integration/test_polyaxon_reporter.py, test_polyaxon_tracked_runs.py, realpods/"
        "test_polyaxon_path.py); vulture took a local variable named lineage for its use",
}


def unused_methods(paths: list[Path], whitelist: Path | None = WHITELIST,
                   qualified: bool = True) -> list[tuple[str, str, int]]:
    """(file, Class.method, line) of every method that nothing reads by its class (see above); ``qualified``: leave
    out the ``Class.method`` entries of the whitelist."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py"))) if f != whitelist]
    trees = {f: ast.parse(f.read_text()) for f in files}
    group = _hierarchies(list(trees.values()))
    anywhere: set[str] = set(CONFIG.get("ignore_names") or [])
    self_uses: set[tuple[str, str]] = set()
    classes = {n.name for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for tree in trees.values():
        _uses(tree, anywhere, self_uses, classes)
    if whitelist is not None and whitelist.is_file():
        anywhere |= {node.attr if isinstance(node, ast.Attribute) else node.id
                     for stmt in ast.parse(whitelist.read_text()).body if isinstance(stmt, ast.Expr)
                     for node in [stmt.value] if isinstance(node, (ast.Attribute, ast.Name))}
    by_group = {(group.get(c, c), m) for c, m in self_uses}
    allowed = qualified_whitelist(whitelist) if whitelist is not None and qualified else {}
    ignored_decorators = {d.lstrip("@") for d in CONFIG.get("ignore_decorators") or []}
    found = []
    for f, tree in trees.items():
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                name = fn.name
                if name.startswith("__") and name.endswith("__"):
                    continue
                if any(ast.unparse(d).split("(")[0] in ignored_decorators for d in fn.decorator_list):
                    continue
                if name in anywhere or (group.get(cls.name, cls.name), name) in by_group \
                        or f"{cls.name}.{name}" in allowed:
                    continue
                found.append((f.as_posix(), f"{cls.name}.{name}", fn.lineno))
    return found


def _rel(found: list[tuple[str, str, int]]) -> dict[tuple[str, str], int]:
    return {(Path(f).resolve().relative_to(REPO).as_posix(), name): line for f, name, line in found}


def test_no_method_is_unused_in_its_class():
    found = _rel(unused_methods([REPO / p for p in CONFIG["paths"]]))
    new = [f"{f}:{line}: {name}" for (f, name), line in found.items() if (f, name) not in PENDING_METHODS]
    assert not new, ("methods nothing calls on their class (delete them; a method only a framework calls goes to the "
                     "Class.method dict of tools/vulture_whitelist.py with why):\n" + "\n".join(new))
    gone = sorted(set(PENDING_METHODS) - set(found))
    assert not gone, f"no longer reported, remove from PENDING_METHODS: {gone}"


def test_every_qualified_whitelist_entry_is_needed():
    entries = qualified_whitelist()
    assert all(why.strip() for why in entries.values())
    reported = {name for _, name in _rel(unused_methods([REPO / p for p in CONFIG["paths"]], qualified=False))}
    assert not set(entries) - reported, f"whitelisted but used (remove): {sorted(set(entries) - reported)}"


def test_the_method_rule_fails_on_a_method_only_another_class_names(tmp_path):
    """The planted case of KubeSupervisor.final: vulture alone passes it (another class reads ``self.final``)."""
    (tmp_path / "mod.py").write_text(
        "class Handle:\n    def final(self):\n        return 1\n\n    def alive(self):\n        return 2\n\n\n"
        "class Reporter:\n    def __init__(self):\n        self.final = None\n\n    def report(self):\n"
        "        return self.final\n\n\n"
        "class Base:\n    def run(self):\n        return self.step()\n\n\n"
        "class Child(Base):\n    def step(self):\n        return 3\n\n\n"
        "Reporter().report(), Handle().alive(), Child().run()\n")
    (tmp_path / "other.py").write_text("import mod\n\n\ndef final():\n    return mod.final\n\n\nfinal()\n")
    assert [item.name for item in unused([tmp_path])] == []  # vulture by name: nothing
    assert [(name, line) for _, name, line in unused_methods([tmp_path], whitelist=None)] == [("Handle.final", 2)]
