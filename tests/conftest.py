"""Shared test helpers. The real components every tier shares (one control plane, one local Ray cluster,
one Polyaxon server per run) are session fixtures of the root plugin tests/infra/fixtures.py; the test
knobs (``MILESRAY_TEST_*``) and the strict switch are in tests/infra/knobs.py; SIGTERM tears the session
down like Ctrl-C (tests/infra/signals.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.infra.knobs", "tests.infra.signals", "tests.infra.fixtures"]

REPO = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "3f" * 32  # a well-formed example digest (no registry is contacted in tests)
IMAGE = f"radixark/miles:latest@{DIGEST}"


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from miles_ray.cli.app import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No MILES_RAY_* config from the developer's shell and no miles-ray.yaml in the cwd."""
    for key in list(os.environ):
        if key.startswith("MILES_RAY_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path
