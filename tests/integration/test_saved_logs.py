"""Logs outlive the cluster, on a REAL local Ray cluster of this test's own (the session cluster is shared and
must never be brought down): a run seen ended by 'submit -f' is saved then; a run still holding its GPUs is
saved by 'down', with the run stopped by 'stop' (saved when it ends); after 'down' 'logs RUN' and 'status RUN'
answer from the saved copies and say so; a supervised run's every attempt (and its supervisor's events) is saved by
'down' and printed whole after it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.local_ray.supervisor import LocalSupervisor
from miles_ray.core.supervision import final_status, fold_attempts
from tests.conftest import REPO
from tests.infra.fixtures import poll

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


def test_every_attempt_of_a_supervised_run_is_saved_and_printed_whole_after_down(own_cluster, cli, tmp_path):
    """Issue 37 (logs are outputs): a supervised run whose trainer (the STAND-IN tests/fakes/fake_ckpt_train.py, with
    Miles' numbering) is SIGKILLed once after rollout 7, resumed from checkpoint 5 and SUCCEEDED. Nothing reads its
    status or logs through miles-ray before 'down' (its end is seen in its supervisor's own events): 'down' saves
    both attempts' driver logs and job info and the supervisor's events; afterwards 'logs RUN' prints both attempts
    whole (byte for byte what the head had), exit 0. An attempt whose copy is really gone is named in one error line
    and 'logs' exits 1, after printing what it has."""
    root = tmp_path / "miles"
    root.mkdir()
    (root / "train.py").write_text((REPO / "tests" / "fakes" / "fake_ckpt_train.py").read_text())  # STAND-IN
    mount = tmp_path / "mnt"
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {mount}\n")
    run = "twice"
    code, out, err = cli("submit", "--address", f"local://{NAME}", "--name", NAME, "--run", run, "--nodes", "1",
                         "--num-rollout", "12", "--extra-args", "--save-interval 3", "--miles-commit", "abc123",
                         "--allow-miles-drift", "--no-follow", "-o", "json", "--env", "MILESRAY_TEST_CRASH_AT_STEP=7",
                         "--env", "MILESRAY_TEST_STEP_SECONDS=0.1")
    assert code == 0, err
    rec = state.load_record(run)
    sid = rec["submission_id"]
    handle = LocalSupervisor(run, rec["supervisor"]["where"])
    final = poll("the supervisor to finish", lambda: final_status(handle.events()), 240, interval=1.0)
    assert final["status"] == "SUCCEEDED", final
    a1, a2 = fold_attempts(handle.events())
    assert (a1["submission_id"], a2["submission_id"], a2["resumed_iteration"]) == (sid, f"{sid}-a2", 5)
    url = own_cluster["dashboard_url"]
    live = {n: ray_jobs.logs(url, s) for n, s in ((1, sid), (2, f"{sid}-a2"))}  # read past miles-ray: saves nothing
    assert "step 7:" in live[1] and "step 11:" in live[2] and "training done at step 11" in live[2]
    assert not (state.saved_dir(run) / "attempt-2").exists()

    code, out, err = cli("down", "--backend", "local", "--name", NAME, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["saved_runs"] == {"saved": [run], "not_saved": {}}
    copies = {1: state.saved_dir(run), 2: state.saved_dir(run) / "attempt-2"}  # runs/RUN.saved/[attempt-N/]
    for n, d in copies.items():
        meta = json.loads((d / "job.json").read_text())
        assert meta["job"]["submission_id"] == (sid if n == 1 else f"{sid}-a2") and meta["reason"] == "down"
        assert meta["job"]["status"] == ("FAILED" if n == 1 else "SUCCEEDED")
        assert (d / "driver.log").read_text() == live[n]
    events = json.loads((state.saved_dir(run) / "supervisor-events.json").read_text())
    assert final_status(events)["status"] == "SUCCEEDED" and len(fold_attempts(events)) == 2

    ck = mount / "runs" / run / "checkpoints"
    code, out, err = cli("logs", run)
    assert code == 0, err
    assert out == (f"== attempt 1 ({sid}) ==\n" + live[1]
                   + f"== attempt 2 ({sid}-a2), resumed from {ck} iter 5, from rollout 6 ==\n" + live[2])
    assert err.count("reading the saved copy") == 2 and "cannot be read" not in out + err
    code, out, _ = cli("status", run, "-o", "json")
    info = json.loads(out)
    assert code == 0 and info["status"] == "SUCCEEDED" and [a["status"] for a in info["attempts"]] == [
        "FAILED", "SUCCEEDED"]

    # an attempt whose copy is really gone: named in one line, exit 1, the other attempt still printed whole
    shutil.rmtree(copies[2])
    code, out, err = cli("logs", run)
    assert code == 1 and out == f"== attempt 1 ({sid}) ==\n" + live[1]
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert f"attempt 2 ({sid}-a2)" in line and "attempt 1 " not in line and "Traceback" not in err
