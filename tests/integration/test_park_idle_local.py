"""Idle detection, park and resume on a REAL local Ray cluster of this test's own (made by 'up --backend local';
the session cluster is shared and is never parked): 'status' says since when the cluster is idle, from the Ray
dashboard's activity API and the job list; 'park' refuses under a running job, '--if-idle-for' parks only an idle
cluster, 'resume' starts the same nodes again."""

from __future__ import annotations

import json
import time

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import state
from tests.integration.test_saved_logs import NAME, own_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.ray

LOCAL = ["--backend", "local", "--name", NAME]


def _status(cli) -> dict:
    code, out, err = cli("status", *LOCAL, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def test_idle_status_park_and_resume(own_cluster, cli):  # noqa: F811
    st = _status(cli)
    assert st["idle"]["idle"] is True and st["idle"]["last_job_end"] is None, st["idle"]
    assert "none has run since the head started" in st["idle"]["reason"]
    code, out, _ = cli("status", *LOCAL)
    assert code == 0 and "idle since " in out

    code, _, err = cli("submit", "--name", NAME, "--rehearse", "--run", "busy", "--nodes", "1", "--hold", "600",
                       "--no-follow")
    assert code == 0, err
    st = _status(cli)
    assert st["idle"]["idle"] is False and "raysubmit" not in st["idle"]["reason"] and st["idle"]["busy_jobs"]

    # busy: --if-idle-for leaves it (exit 0, says why), a plain park refuses (the scale guard), nothing stopped
    code, out, err = cli("park", *LOCAL, "--if-idle-for", "1s", "-o", "json")
    assert code == 0 and json.loads(out)["parked"] is False and "busy" in json.loads(out)["reason"], err
    code, _, err = cli("park", *LOCAL)
    [line] = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and line.startswith(f"error: refusing to park cluster {NAME}: run 'busy' is ") and "--force" in line
    assert lr.read_state(state.local_clusters_dir(), NAME) is not None

    code, _, err = cli("stop", "busy")
    assert code == 0, err
    st = _status(cli)
    assert st["idle"]["idle"] is True and st["idle"]["last_job_end"] is not None, st["idle"]
    assert st["idle"]["idle_seconds"] < 60
    code, out, _ = cli("park", *LOCAL, "--if-idle-for", "1h", "-o", "json")
    assert code == 0 and json.loads(out)["parked"] is False and "idle for" in json.loads(out)["reason"]

    time.sleep(2)
    code, out, err = cli("park", *LOCAL, "--if-idle-for", "1s", "-o", "json")
    assert code == 0, err
    parked = json.loads(out)
    assert parked["parked"] is True and parked["kept"]["nodes"] == 1 and parked["kept"]["gpus_per_node"] == 8, parked
    assert lr.read_state(state.local_clusters_dir(), NAME) is None  # its processes are gone
    code, out, _ = cli("status", "--name", NAME, "-o", "json")  # backend auto finds the parked cluster
    assert code == 0 and json.loads(out)["parked"] is True
    code, _, err = cli("logs", "busy")
    assert code == 0 and "reading the saved copy" in err

    code, out, err = cli("resume", "--name", NAME, "-o", "json")
    assert code == 0, err
    back = json.loads(out)
    assert back["resumed"] is True and back["gpu_node_count"] == 1 and back["total_gpus"] == 8
    code, out, err = cli("resume", *LOCAL, "-o", "json")
    assert code == 0 and json.loads(out)["resumed"] is False, err
    st = _status(cli)
    assert st["idle"]["idle"] is True and st["gpu_node_count"] == 1


def test_park_bad_duration_is_bad_input(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    code, out, err = cli("park", "--backend", "local", "--name", "nothing", "--if-idle-for", "soon")
    assert code == 2 and out == "" and err.strip() == (
        "error: --if-idle-for 'soon' is not a duration (write it like 90s, 30m, 2h, 1d or 1h30m)")
