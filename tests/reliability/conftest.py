"""Fixtures for the reliability and security suite: the real components of tests/e2e and
tests/integration, re-exported, plus a ledger the benchmark (benchmarks/reliability.py) reads to count
the faults injected and survived, the races run and the secrets leaked in a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import core_v1, custom_objects, fake_k8s, k8s_api, namespace, wait_for  # noqa: F401
from tests.e2e.test_kube_cli import kube_env, shared_volume  # noqa: F401
from tests.integration.conftest import local_ray, polyaxon_server  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
LEDGER_ENV = "MILES_RAY_TEST_LEDGER"  # a TEST_ knob: not read as a config key


class Ledger:
    """Appends one JSON line per event: {"kind": "fault"|"race"|"leak_scan", "name", "ok", ...}."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.path = os.environ.get(LEDGER_ENV)

    def record(self, kind: str, name: str, ok: bool, **extra: Any) -> None:
        if not self.path:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"kind": kind, "name": name, "ok": ok, "test": self.test, **extra}) + "\n")


@pytest.fixture
def ledger(request) -> Ledger:
    return Ledger(request.node.nodeid)


def cli_proc(args: list[str], env: dict[str, str], cwd: Path, **kw: Any) -> subprocess.Popen:
    """The real console entry point in a child process (for signals and true concurrency)."""
    return subprocess.Popen([sys.executable, "-m", "miles_ray", *args], env=env, cwd=str(cwd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MILES_RAY_", "RAY_ADDRESS", "POLYAXON_HOST")) or k == LEDGER_ENV}
    env.update({"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **extra})
    return env


def wait_line(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """Read the child's stderr until a line containing ``needle`` (progress goes to stderr)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if needle in line:
            return seen
    raise AssertionError(f"no {needle!r} from the child within {timeout:.0f}s; stderr so far:\n{seen}")


def one_error_line(err: str) -> bool:
    return sum(1 for ln in err.splitlines() if ln.startswith("error:")) == 1 and "Traceback" not in err
