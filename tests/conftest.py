"""Shared test helpers. The real components every tier shares (one control plane, one local Ray cluster,
one Polyaxon server per run) are session fixtures of the root plugin tests/infra/fixtures.py; the test
knobs (``MILESRAY_TEST_*``) and the strict switch are in tests/infra/knobs.py; SIGTERM tears the session
down like Ctrl-C (tests/infra/signals.py)."""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

import pytest

pytest_plugins = ["tests.infra.knobs", "tests.infra.signals", "tests.infra.fixtures"]

REPO = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "3f" * 32  # a well-formed example digest (no registry is contacted in tests)
IMAGE = f"radixark/miles:latest@{DIGEST}"


CLI_CALLS_KEPT = 4  # the last calls of a test, shown when it fails


@pytest.fixture
def cli(capsys, request):
    """Run the CLI in-process; returns (exit code, stdout, stderr). A failing test's report shows its last
    calls with what the CLI printed, so a wrong exit code says why without running it again."""
    from miles_ray.cli.app import main

    calls = request.node.__dict__.setdefault("_miles_ray_cli_calls", deque(maxlen=CLI_CALLS_KEPT))

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        calls.append((args, code, captured.out, captured.err))
        return code, captured.out, captured.err

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    calls = item.__dict__.get("_miles_ray_cli_calls")
    if calls and report.failed:
        for args, code, out, err in calls:
            report.sections.append((f"miles-ray {' '.join(args)[:160]} -> exit {code}",
                                    f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"))


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No MILES_RAY_* config from the developer's shell and no miles-ray.yaml in the cwd."""
    for key in list(os.environ):
        if key.startswith("MILES_RAY_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path
