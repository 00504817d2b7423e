"""The integration tier: real components that run on this machine (the session's local Ray cluster and
Polyaxon server come from the root plugin, tests/infra/fixtures.py)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def env(local_ray, monkeypatch, tmp_path):
    """The session's local Ray cluster, with this test's own state dir and cwd and no MILES_RAY_*/RAY_ADDRESS
    from the developer's shell."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + ["RAY_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    return local_ray
