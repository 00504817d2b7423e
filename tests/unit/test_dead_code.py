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

# Product names vulture reports that are neither dead nor reached by a framework: used only by tests, or by nothing
# yet. Not whitelisted on purpose: each is a decision (delete it and change the tests that use it, or make the
# product use it). The list only shrinks: a name that is no longer reported must leave it.
PENDING = {
    ("miles_ray/adapters/polyaxon_api/client.py", "find_run_by_name"):
        "PolyaxonApi method: only tests call it (integration, e2e, reliability: 'was a run created?')",
    ("miles_ray/cli/options.py", "run_options"):
        "the run option group's decorator: no verb uses it yet (the run verbs are moving to it in issue 22)",
    ("miles_ray/core/builders.py", "head_and_worker_containers"):
        "only tests/unit/test_builders.py and test_ray_auth.py read containers with it",
    ("miles_ray/core/crd_fields.py", "unknown_fields"):
        "only tests/unit/test_crd_fields.py; the product uses first_unknown_field",
    ("miles_ray/core/entrypoint.py", "MILES_RAY_ENV"):
        "only tests/unit/test_upstream_parity.py filters the job env with it",
    ("miles_ray/core/entrypoint.py", "direct_entrypoint"):
        "only tests/unit/test_submit_prepare.py; core/submission.py joins direct_argv itself",
    ("miles_ray/core/planner.py", "RULES"):
        "the rule catalogue: only tests/unit/test_planner.py checks violation names against it",
}


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
