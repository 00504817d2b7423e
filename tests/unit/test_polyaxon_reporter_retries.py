"""Which failed Polyaxon writes the supervisor's reporter (launchers/polyaxon_report.py) tries again. The end to end
case (a 405 from the real server, through a fault-injecting proxy) is tests/integration/test_polyaxon_reporter.py."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO


@pytest.fixture
def reporter(monkeypatch):
    spec = importlib.util.spec_from_file_location("polyaxon_report_retries", REPO / "launchers" / "polyaxon_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    module.slept = slept
    return module


class Refused(Exception):
    def __init__(self, status: int | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize("status", [None, 405, 429, 500, 503])
def test_not_handled_is_tried_again_until_it_goes_through(reporter, status, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise Refused(status)

    reporter.PolyaxonReporter._retried("log the status running", write)
    assert len(calls) == 3 and reporter.slept == [1.0, 2.0]
    assert "could not" not in capsys.readouterr().err


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_refused_is_not_repeated_and_said_once(reporter, status, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise Refused(status)

    reporter.PolyaxonReporter._retried("log the status running", write)
    assert len(calls) == 1 and reporter.slept == []
    assert capsys.readouterr().err.count("could not log the status running (1 attempt(s))") == 1


def test_a_write_that_never_goes_through_gives_up_after_the_bound(reporter, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise Refused(503)

    reporter.PolyaxonReporter._retried("log the final status SUCCEEDED", write)
    assert len(calls) == reporter.WRITE_ATTEMPTS and reporter.slept == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert f"({reporter.WRITE_ATTEMPTS} attempt(s))" in capsys.readouterr().err
