"""Which failed Polyaxon writes the supervisor's reporter (launchers/polyaxon_report.py) tries again. The end to end
case (a 405 from the real server, through a fault-injecting proxy) is tests/integration/test_polyaxon_reporter.py."""

from __future__ import annotations

import pytest

from tests.infra.scripts import load_script

REPORTER = load_script("launchers/polyaxon_report.py", "miles_ray_polyaxon_report")


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """The reporter's waits between attempts, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr(REPORTER.time, "sleep", waits.append)
    return waits


class Refused(Exception):
    def __init__(self, status: int | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize("status", [None, 405, 429, 500, 503])
def test_not_handled_is_tried_again_until_it_goes_through(slept, status, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise Refused(status)

    REPORTER.PolyaxonReporter._retried("log the status running", write)
    assert len(calls) == 3 and slept == [1.0, 2.0]
    assert "could not" not in capsys.readouterr().err


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_refused_is_not_repeated_and_said_once(slept, status, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise Refused(status)

    REPORTER.PolyaxonReporter._retried("log the status running", write)
    assert len(calls) == 1 and slept == []
    assert capsys.readouterr().err.count("could not log the status running (1 attempt(s))") == 1


def test_a_write_that_never_goes_through_gives_up_after_the_bound(slept, capsys):
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise Refused(503)

    REPORTER.PolyaxonReporter._retried("log the final status SUCCEEDED", write)
    assert len(calls) == REPORTER.WRITE_ATTEMPTS and slept == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert f"({REPORTER.WRITE_ATTEMPTS} attempt(s))" in capsys.readouterr().err
