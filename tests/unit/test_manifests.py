"""manifests/ holds what `miles-ray render` produces today (users read and diff these)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

IMG = "radixark/miles:latest@sha256:" + "0" * 64
CASES = {
    "miles-qwen3-4b": ["--nodes", "4"],
    "miles-qwen3-4b-disagg": ["--recipe", "Qwen3-4B", "--nodes", "4", "--layout", "disaggregated", "--rollout-nodes", "2"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_examples_are_current(cli, clean_env, name: str) -> None:
    out_dir = clean_env / "m"
    code, _, err = cli("render", "-F", "all", *CASES[name], "--name", name, "--image", IMG, "--ray-version", "2.60.0",
                       "--out", str(out_dir))
    assert code == 0, err
    for fresh in sorted(out_dir.iterdir()):
        committed = REPO / "manifests" / fresh.name
        assert committed.is_file(), f"{committed} missing: run scripts/render-examples.sh"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run scripts/render-examples.sh"
