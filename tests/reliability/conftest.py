"""The reliability and security suite: helpers to run the real CLI in child processes (for signals and true
concurrency), and the ledger the benchmark (benchmarks/reliability.py) reads to count the faults injected
and survived, the races run and the secrets leaked in a run. The real components (control plane, local
Ray, Polyaxon server) are the session's own, from the root plugin tests/infra/fixtures.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.infra.knobs import LEDGER as LEDGER_ENV
from tests.infra.procs import default_signals

REPO = Path(__file__).resolve().parents[2]


class Ledger:
    """The events one test injects or runs, for the ledger file ``$MILESRAY_TEST_LEDGER`` (one JSON line
    each: ``{"kind": "fault"|"race"|"leak_scan"|..., "name", "ok", "outcome", "test", ...details}``).

    A test calls ``record`` when it starts the event (before injecting the fault); it never says whether
    it survived: ``ok`` is the test's own result (setup, call and teardown all passed), written by the
    ``pytest_runtest_makereport`` hook below when the test ends, so a failing test records ``ok: false``."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.events: list[dict[str, Any]] = []

    def record(self, kind: str, name: str, **details: Any) -> dict[str, Any]:
        """Register one event of this test; returns its entry, to which details learnt later can be
        added (``event["reads"] = n``)."""
        event = {"kind": kind, "name": name, **details}
        self.events.append(event)
        return event

    def write(self, reports: list[pytest.TestReport]) -> None:
        path = os.environ.get(LEDGER_ENV)
        if not path or not self.events:
            return
        ok = all(r.passed for r in reports)
        outcome = "failed" if any(r.failed for r in reports) else "skipped" if any(r.skipped for r in reports) \
            else "passed"
        with open(path, "a") as fh:
            for event in self.events:
                fh.write(json.dumps({**event, "ok": ok, "outcome": outcome, "test": self.test}) + "\n")


LEDGER_KEY = pytest.StashKey[Ledger]()
REPORTS_KEY = pytest.StashKey[list]()


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> Ledger:
    led = Ledger(request.node.nodeid)
    request.node.stash[LEDGER_KEY] = led
    return led


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Collect the test's reports; after its teardown, write its ledger events with its real outcome."""
    outcome = yield
    reports = item.stash.setdefault(REPORTS_KEY, [])
    reports.append(outcome.get_result())
    if reports[-1].when == "teardown" and LEDGER_KEY in item.stash:
        item.stash[LEDGER_KEY].write(reports)


def cli_proc(args: list[str], env: dict[str, str], cwd: Path, **kw: Any) -> subprocess.Popen:
    """The real console entry point in a child process (for signals and true concurrency), with SIGINT and
    SIGTERM at their defaults whatever this runner inherited (tests/infra/procs.py)."""
    return subprocess.Popen([sys.executable, "-m", "miles_ray", *args], env=env, cwd=str(cwd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals, **kw)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without miles-ray config or Ray/Polyaxon addresses (test knobs, MILESRAY_TEST_*,
    stay), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILES_RAY_", "RAY_ADDRESS", "POLYAXON_HOST"))}
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
