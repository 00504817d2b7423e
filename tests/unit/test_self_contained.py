"""The repository stands on its own: no file (code, tests, scripts, docs, data) refers to anything beside
the clone, so a fresh clone with nothing next to it runs the whole suite.

Checked on every file of the checkout (tracked or new, ignored ones left out): no reference to the workplace's
side directories or their environment variable, no absolute path into the workplace, no Python module or
shell script climbing above the repository root from its own location, no Markdown link leading outside.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO

# Spelled in pieces so that this file does not match itself.
FORBIDDEN = {
    "../" "shared": "a directory beside the repository",
    "shared/" "reference": "a directory beside the repository",
    "MILES_RAY_" "SHARED": "the variable that pointed at a directory beside the repository",
}
WORKPLACE_PATH = re.compile(r"(?<![\w~.$])/" r"work/")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "node_modules"}

PY_ANCESTOR = re.compile(r"Path\(__file__\)(?:\.resolve\(\)|\.absolute\(\))?(?:\.parents\[(\d+)\]|((?:\.parent)+))")
PY_REPO_PARENT = re.compile(r"\b(?:REPO|ROOT|REPO_ROOT)(?:\.parent\b|\s*/\s*['\"]\.\.['\"])")
SH_ANCESTOR = re.compile(r"dirname \"?\$(?:0|\{BASH_SOURCE\[0\]\}|\{0\})\"?\)((?:/\.\.)+)")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def repository_files() -> list[Path]:
    """Every file of the checkout: git's tracked and untracked-but-not-ignored files, or (outside git) a walk
    of the tree without version-control, virtualenv and cache directories."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                              capture_output=True, timeout=60)
    except FileNotFoundError:
        proc = None
    if proc is not None and proc.returncode == 0:
        names = sorted({n for n in proc.stdout.decode().split("\0") if n})
        return [REPO / n for n in names if (REPO / n).is_file()]
    return sorted(p for p in REPO.rglob("*") if p.is_file()
                  and not SKIP_DIRS & set(p.relative_to(REPO).parts)
                  and not any(part.endswith(".egg-info") for part in p.relative_to(REPO).parts))


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (e.g. a vendored tarball): nothing to read as a reference


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _outside(rel: PurePosixPath, ups: int) -> bool:
    """Does going `ups` directories up from the directory holding `rel` leave the repository?"""
    return ups > len(rel.parts) - 1


def findings(path: Path) -> list[str]:
    """Every reference in one file to something outside the repository, as 'file:line: what'."""
    text = _text(path)
    if text is None:
        return []
    rel = PurePosixPath(path.relative_to(REPO).as_posix())
    out: list[str] = []
    for needle, what in FORBIDDEN.items():
        for m in re.finditer(re.escape(needle), text):
            out.append(f"{rel}:{_line(text, m.start())}: {needle!r} ({what})")
    for m in WORKPLACE_PATH.finditer(text):
        out.append(f"{rel}:{_line(text, m.start())}: absolute path into the workplace outside the repository")
    if rel.suffix == ".py":
        for m in PY_ANCESTOR.finditer(text):
            ups = int(m.group(1)) if m.group(1) is not None else m.group(2).count(".parent") - 1
            if _outside(rel, ups):
                out.append(f"{rel}:{_line(text, m.start())}: {m.group(0)} is above the repository root")
        for m in PY_REPO_PARENT.finditer(text):
            out.append(f"{rel}:{_line(text, m.start())}: {m.group(0)} is above the repository root")
    if rel.suffix == ".sh" or text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/bash"):
        for m in SH_ANCESTOR.finditer(text):
            if _outside(rel, m.group(1).count("..")):
                out.append(f"{rel}:{_line(text, m.start())}: {m.group(0)} is above the repository root")
    if rel.suffix == ".md":
        for m in MD_LINK.finditer(text):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # an anchor or a URL
            resolved = (REPO / target.lstrip("/")) if target.startswith("/") else (path.parent / target)
            if not resolved.resolve().is_relative_to(REPO.resolve()):
                out.append(f"{rel}:{_line(text, m.start())}: link {m.group(1)} leads outside the repository")
    return out


def test_no_file_refers_to_anything_outside_the_repository() -> None:
    files = repository_files()
    assert REPO / "README.md" in files and REPO / "tests" / "unit" / "test_self_contained.py" in files
    found = [f for p in files for f in findings(p)]
    assert not found, "references outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("name, text, expected", [
    ("tests/unit/x.py", 'ROOT = Path(__file__).resolve().parents[2]\n', 0),
    ("tests/unit/x.py", 'ROOT = Path(__file__).resolve().parents[' '3]\n', 1),
    ("tests/x.py", 'HERE = Path(__file__).parent.parent\n', 0),
    ("tests/x.py", 'HERE = Path(__file__).parent.parent.parent\n', 1),
    ("tests/x.py", 'DATA = REPO.' 'parent / "data"\n', 1),
    ("tests/x.py", 'DATA = REPO / ".' '." / "data"\n', 1),
    ("tests/x.py", 'DATA = Path("/' 'work/elsewhere")\n', 1),
    ("tests/x.py", 'os.environ.get("MILES_RAY_' 'SHARED")\n', 1),
    ("scripts/x.sh", 'cd "$(dirname "$0")/.."\n', 0),
    ("scripts/x.sh", 'cd "$(dirname "$0")/../.."\n', 1),
    ("docs/x.md", "see [the guide](../README.md) and [a site](https://example.org/../x)\n", 0),
    ("docs/x.md", "see [notes](../../notes.md)\n", 1),
    ("docs/x.md", "facts in ../" "shared/" "reference\n", 2),
    ("tests/reliability/x.py", 'BAD = ["../../etc/passwd", "a/../../b"]\n', 0),  # hostile input values, not paths
])
def test_the_scanner_finds_what_it_should(tmp_path, monkeypatch, name, text, expected) -> None:
    """The scanner itself, on small made-up files placed in a throwaway repository root (the samples are
    spelled in pieces so that this file does not match itself)."""
    import tests.unit.test_self_contained as me

    monkeypatch.setattr(me, "REPO", tmp_path)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    assert len(me.findings(path)) == expected, me.findings(path)


def test_every_package_of_the_tree_is_in_the_built_distribution():
    """pyproject's [tool.setuptools] packages is an explicit list: a package split out of a module (core/submission,
    backends/kube, core/memory) and not listed there works in the editable install and is missing from a wheel."""
    import tomllib

    from tests.conftest import REPO

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "miles_ray").rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
