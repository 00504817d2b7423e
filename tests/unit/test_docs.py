"""What the docs show is what the repository has: every file path the README and docs/ name in backticks exists
(relative to the repository, or to miles_ray/ for the package's own modules), and the embedded walkthrough's
transcript shows exactly the commands tools/walkthrough_embedded.py runs to regenerate it."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.infra.scripts import load_script

PATH = re.compile(r"`(?:\./)?((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+\.(?:py|sh|md|yaml|yml|json|toml))`")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def named_paths(text: str) -> list[str]:
    return PATH.findall(text)


def test_the_scan_finds_paths():
    assert named_paths("see `tests/fakes/x.py`, `./scripts/test.sh` and `.github/ci.yml`, not `ray status`") == [
        "tests/fakes/x.py", "scripts/test.sh", ".github/ci.yml"]


def test_every_path_the_docs_name_exists():
    missing = [f"{doc.relative_to(REPO)}: {p}" for doc in DOCS for p in named_paths(doc.read_text())
               if not (REPO / p).exists() and not (REPO / "miles_ray" / p).exists()]
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)


def test_the_embedded_transcript_shows_the_regenerating_commands():
    tool = load_script("tools/walkthrough_embedded.py", "miles_ray_walkthrough_embedded")
    text = (REPO / "docs" / "walkthrough.md").read_text()
    block = text.split(tool.START, 1)[1].split(tool.END, 1)[0]
    shown = [ln[2:] for ln in block.splitlines() if ln.startswith("$ miles-ray ")]
    assert shown == [c.format(host="http://127.0.0.1:<port>") for c in tool.COMMANDS]
    assert block.count("[exit ") == len(tool.COMMANDS)
