"""SIGTERM ends a test run the way Ctrl-C does: the session's fixtures are torn down first.

CI runners and ``timeout`` stop a run with SIGTERM, and a run started in the background (``cmd &``) has
SIGINT ignored, so SIGTERM is often the only signal that reaches it. By default SIGTERM kills the runner
on the spot and every real component the session started (the local Ray cluster, the Polyaxon server, the
control plane) is left running, holding ports and memory for the next run. Here the first SIGTERM is
turned into KeyboardInterrupt, so pytest stops and runs every fixture's teardown; should the running test
swallow that KeyboardInterrupt (the CLI run in-process turns Ctrl-C into exit code 130), the session is also
marked to stop after that test. A second SIGTERM kills at once (a teardown that hangs cannot keep the
runner alive).

Python handlers do not survive exec: children of the run still get SIGTERM's default disposition.
"""

from __future__ import annotations

import signal
import threading

import pytest


_SESSION: list[pytest.Session] = []


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for session in _SESSION:
        session.shouldstop = "SIGTERM: the test run was asked to stop"
    raise KeyboardInterrupt("SIGTERM: stopping the test run and tearing down its real components")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION[:] = [session]
