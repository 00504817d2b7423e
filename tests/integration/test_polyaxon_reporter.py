"""The supervisor's Polyaxon reporter (launchers/polyaxon_report.py) against the real Polyaxon API server (haupt
sandbox), without Ray: what a supervisor started again (it re-reads each attempt's log from its start) reports, and
a log line cut between two pieces of the log. The log is what the STAND-IN trainer tests/fakes/fake_metrics_train.py
prints."""

from __future__ import annotations

import atexit
import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.polyaxon]

PROJECT = "miles-reporter"


def reporter_module():
    spec = importlib.util.spec_from_file_location("polyaxon_report", REPO / "launchers" / "polyaxon_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_supervisor_started_again_reports_nothing_twice(polyaxon_server, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns
    from miles_ray.core.metrics import parse_metrics

    polyaxon_server.create_project(PROJECT)
    runs = TrackedRuns(PolyaxonApi(host=polyaxon_server.host), "default", PROJECT)
    uuid = runs.create("rep-1", inputs={"command": "train.py"}, tags=["miles-ray"], meta={"miles_ray_run": "rep-1"})
    log = subprocess.run([sys.executable, str(REPO / "tests" / "fakes" / "fake_metrics_train.py"), "--num-rollout",
                          "6", "--eval-interval", "3", "--eval-prompt-data", "aime", "/d"],
                         capture_output=True, text=True, check=True).stdout
    section = {"host": polyaxon_server.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
               "work_dir": str(tmp_path / "work")}
    module = reporter_module()
    first = module.make_reporter(section)
    first.attempt_started({"event": "attempt_started", "attempt": 1, "submission_id": "rep-1"})
    cut = log.index("\n", len(log) // 2) + 5  # in the middle of a line
    first.log_chunk(1, log[:cut])
    first.upload()  # then it is gone (SIGKILL): nothing more of it, not even at its exit
    atexit.unregister(first.close)

    again = module.make_reporter(section)  # the supervisor started again: the attempt's log from its start
    again.log_chunk(1, log[:100])
    again.log_chunk(1, log[100:])
    again.finished({"event": "finished", "status": "SUCCEEDED", "reason": "the job succeeded"})

    assert runs.logs(uuid) == [line for line in log.splitlines() if line.strip()]
    want = parse_metrics(log)["metrics"]
    got = runs.metrics(uuid, ["train/loss", "eval/aime", "perf/rollout_time", "rollout/raw_reward"])
    for name, points in got.items():
        assert len(points) == want[name]["count"] and points[-1] == (want[name]["id"], want[name]["value"]), name
    run = runs.run(uuid)
    assert run["status"] == "succeeded" and run["outputs"]["train__loss"] == want["train/loss"]["value"]
    assert run["outputs"]["eval__aime"] == want["eval/aime"]["value"]
