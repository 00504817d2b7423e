"""The test suite's environment knobs and its strict switch (a pytest plugin, loaded by tests/conftest.py).

Every knob is named ``MILESRAY_TEST_*``. miles-ray reads ``MILES_RAY_*`` variables as configuration and
refuses names it does not know, so a test or tooling knob must never start with ``MILES_RAY_``: these
never reach the product.

  MILESRAY_TEST_STRICT=1           a skipped test is a failure (scripts/test.sh sets it unless MILESRAY_TEST_STRICT=0):
                                   when a tier's real component (the control plane, the Polyaxon server,
                                   the Polyaxon agent stack, the lint tools, local Ray) cannot be had, the
                                   run fails with the reason instead of passing without that tier.
  MILESRAY_TEST_E2E_NODES=N        fake GPU nodes of the session's control plane (default 6), plus one CPU node.
  MILESRAY_TEST_E2E_GPUS=G         nvidia.com/gpu per fake GPU node (default 8).
  MILESRAY_TEST_E2E_KEEP=1         leave the control plane running after the session (prints how to stop it).
  MILESRAY_TEST_LEDGER=FILE        the reliability tests append one JSON line per fault/race/scan to FILE
                                   (benchmarks/reliability.py sets and reads it).
  MILESRAY_TEST_CACHE=DIR          cache of the control-plane binaries and the Polyaxon server venv
                                   (cluster/, scripts/haupt-venv.sh; default ~/.cache/miles-ray).
  MILESRAY_TEST_FAKEGPU_DIR=DIR    default directory of ``cluster/fakegpu.py up`` by hand.
  MILESRAY_TEST_POLYAXON_CHARTS_GIT=DIR  a polyaxon/charts git repository to extract the agent stack's
                                   CRDs from when they are neither cached nor vendored (cluster/polyaxon_stack.py).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest

PREFIX = "MILESRAY_TEST_"
STRICT = PREFIX + "STRICT"
E2E_NODES = PREFIX + "E2E_NODES"
E2E_GPUS = PREFIX + "E2E_GPUS"
E2E_KEEP = PREFIX + "E2E_KEEP"
LEDGER = PREFIX + "LEDGER"


def flag(name: str) -> bool:
    """A boolean knob: set to anything but '', 0, false or no."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def strict() -> bool:
    return flag(STRICT)


def unavailable(component: str, reason: str) -> NoReturn:
    """Skip the calling test (or every test of a session fixture) because ``component`` cannot run here,
    loudly; under ``MILESRAY_TEST_STRICT=1`` the skip is reported as a failure (hook below)."""
    print("\n" + "!" * 100 + f"\n!! {component.upper()} SKIPPED: {reason}\n" + "!" * 100, file=sys.stderr)
    pytest.skip(f"{component} unavailable (set {STRICT}=1 to fail instead): {reason}")


_STANDINS: dict[str, str] = {}


def standin_used(component: str, fake: str, why: str) -> None:
    """Record that a FAKE (``fake``, under tests/fakes) stood in for ``component``; the run's summary lists every
    one, so a pass that leaned on a stand-in is never mistaken for the real component's."""
    _STANDINS[component] = f"{fake} ({why})"


def pytest_report_header(config: pytest.Config) -> str:
    return f"{STRICT}: {'on (a skip is a failure)' if strict() else 'off'}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Strict mode: a skipped setup, call or teardown is reported as failed, with the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{STRICT}=1: a skip is a failure here: {reason}"


_TIER_SECONDS: dict[str, float] = {}
_MODULE_SECONDS: dict[str, float] = {}


def tier_of(nodeid: str) -> str:
    """The tier of a test, from its node id ``tests/<tier>/...`` (else the node id's file)."""
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0].split("::")[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration (set-up of shared fixtures included) to its tier, tests/<tier>/..."""
    tier = tier_of(report.nodeid)
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 — pytest's own reporter type
    for component, fake in sorted(_STANDINS.items()):
        terminalreporter.write_line(f"STAND-IN used for {component}: {fake}", yellow=True)
    if _TIER_SECONDS:
        terminalreporter.write_line("time per tier (set-up + tests + tear-down, seconds): " + ", ".join(
            f"{t} {s:.0f}" for t, s in sorted(_TIER_SECONDS.items(), key=lambda kv: -kv[1])))
    if len(_MODULE_SECONDS) > 1:  # where the CI budget goes, in the part of the output CI keeps
        slowest = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
        terminalreporter.write_line("slowest test files (seconds): " + ", ".join(
            f"{m.removeprefix('tests/')} {s:.0f}" for m, s in slowest))
