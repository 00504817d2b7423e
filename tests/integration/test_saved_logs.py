"""Logs outlive the cluster, on a REAL local Ray cluster of this test's own (the session cluster is shared and
must never be brought down): a run seen ended by 'submit -f' is saved then; a run still holding its GPUs is
saved by 'down', with the run stopped by 'stop' (saved when it ends); after 'down' 'logs RUN' and 'status RUN'
answer from the saved copies and say so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import state

pytestmark = pytest.mark.ray

NAME = "savedlogs"


@pytest.fixture
def own_cluster(cli, monkeypatch, tmp_path):
    """A 1-worker x 8 fake-GPU local cluster made by 'up --backend local', in this test's state dir; stopped by
    PID at the end whatever happened."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + ["RAY_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("up", "--backend", "local", "--name", NAME, "--nodes", "1", "-G", "8", "--timeout", "240",
                         "-o", "json")
    assert code == 0, err
    try:
        yield json.loads(out)
    finally:
        local = state.local_clusters_dir()
        st = lr.read_state(local, NAME)
        if st is not None:
            procs = lr.processes_of(st)
            try:
                lr.down(local, NAME)
            except Exception:  # noqa: BLE001 - the test already brought it down, or it died: check nothing is left
                pass
            assert not sorted({pid for p in procs for pid in lr.session_members(p)}), "local Ray processes left"


def _saved(run: str) -> dict:
    d = state.saved_dir(run)
    assert (d / "job.json").is_file() and (d / "driver.log").is_file(), f"no saved copy of {run} in {d}"
    return json.loads((d / "job.json").read_text())


def test_logs_and_status_outlive_the_cluster(own_cluster, cli):
    # 1. a run seen ended by submit -f is saved at once (the cluster still runs)
    code, _, err = cli("submit", "--name", NAME, "--rehearse", "--run", "ended", "--nodes", "1", "--follow")
    assert code == 0, err
    meta = _saved("ended")
    assert meta["job"]["status"] == "SUCCEEDED" and meta["reason"] == "the job ended (SUCCEEDED)"
    live_logs = (state.saved_dir("ended") / "driver.log").read_text()
    assert "REHEARSAL_RESULT " in live_logs

    # 2. a run stopped by 'stop' is saved once it has ended
    code, _, err = cli("submit", "--address", f"local://{NAME}", "--name", NAME, "--rehearse",
                       "--run", "stopped", "--nodes", "1", "--hold", "600", "--no-follow")
    assert code == 0, err
    code, out, err = cli("stop", "stopped", "-o", "json")
    assert code == 0 and json.loads(out)["status"] == "STOPPED", err
    assert _saved("stopped")["job"]["status"] == "STOPPED"

    # 3. a run still holding its GPUs is saved by 'down' (recorded with the head's URL)
    code, _, err = cli("submit", "--name", NAME, "--rehearse", "--run", "held", "--nodes", "1", "--hold", "600",
                       "--no-follow")
    assert code == 0, err
    assert not state.saved_dir("held").exists()
    assert state.load_record("held")["address"] == own_cluster["dashboard_url"]
    code, out, err = cli("down", "--backend", "local", "--name", NAME, "-o", "json")
    assert code == 0, err
    down = json.loads(out)
    assert sorted(down["saved_runs"]["saved"]) == ["ended", "held", "stopped"] and not down["saved_runs"]["not_saved"]
    assert lr.read_state(state.local_clusters_dir(), NAME) is None
    held = _saved("held")
    assert held["reason"] == "down" and held["job"]["status"] in {"PENDING", "RUNNING"}

    # 4. after down: logs and status read the saved copies and say so
    code, out, err = cli("logs", "ended")
    assert code == 0, err
    assert out == live_logs and "reading the saved copy" in err and str(state.saved_dir("ended")) in err
    code, out, err = cli("logs", "ended", "-f", "-o", "json")
    assert code == 0 and json.loads(out)["logs"] == live_logs and json.loads(out)["status"] == "SUCCEEDED", err
    code, out, _ = cli("status", "ended")
    assert code == 0 and "SUCCEEDED" in out and "read the saved copy" in out
    code, out, _ = cli("status", "held", "-o", "json")
    info = json.loads(out)
    assert code == 6 and info["status"] == "STOPPED" and "when its cluster went down" in info["message"]
    assert info["saved_copy"]["reason"] == "down"
    code, out, err = cli("logs", "held")
    assert code == 0 and out == (state.saved_dir("held") / "driver.log").read_text(), err
    code, out, _ = cli("status", "stopped", "-o", "json")
    assert code == 6 and json.loads(out)["status"] == "STOPPED"


def test_without_a_saved_copy_a_gone_cluster_is_still_an_error(own_cluster, cli):
    """A run whose cluster vanished with no copy saved (its processes killed, not 'down'): one error line."""
    code, _, err = cli("submit", "--name", NAME, "--rehearse", "--run", "lost", "--nodes", "1", "--hold", "600",
                       "--no-follow")
    assert code == 0, err
    lr.down(state.local_clusters_dir(), NAME)  # the adapter directly: no copy saved
    code, _, err = cli("logs", "lost")
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err
    assert not Path(state.saved_dir("lost")).exists()
