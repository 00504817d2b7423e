"""Issue 24 on the embedded cluster: a supervised run whose trainer failed waits (bounded, saying so) until its GPU
worker is back in Ray before it starts the next attempt; `stop` while it waits -> STOPPED, and nothing starts it
again once the worker is back. On a REAL local Ray cluster of this test's own (1 GPU worker x 8 fake GPUs: the
session cluster is shared and must keep its nodes), the worker removed and added back with the local cluster's own
scale (the fault, injected by the test). train.py is the STAND-IN tests/fakes/fake_ckpt_train.py; it crashes
(SIGKILL) once the test creates a file."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.local_ray.supervisor import LocalSupervisor
from tests.conftest import REPO
from tests.infra.fixtures import poll

pytestmark = pytest.mark.ray

NAME = "supwait"
ADDRESS = f"local://{NAME}"


@pytest.fixture
def own_cluster(cli, monkeypatch, tmp_path):
    """A 1-worker x 8 fake-GPU local cluster made by 'up --backend local', in this test's state dir, with a Miles
    checkout whose train.py is the STAND-IN; stopped by PID at the end whatever happened."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + ["RAY_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "miles"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_ckpt_train.py", root / "train.py")  # STAND-IN train.py
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {tmp_path / 'mnt'}\n")
    code, out, err = cli("up", "--backend", "local", "--name", NAME, "--nodes", "1", "-G", "8", "--timeout", "240",
                         "-o", "json")
    assert code == 0, err
    try:
        yield tmp_path
    finally:
        for rec in state.list_records():  # no supervisor outlives the test
            if rec.get("supervisor"):
                LocalSupervisor(rec["run"], rec["supervisor"].get("where")).stop()
        local = state.local_clusters_dir()
        st = lr.read_state(local, NAME)
        if st is not None:
            procs = lr.processes_of(st)
            try:
                lr.down(local, NAME)
            except Exception:  # noqa: BLE001 - the test already brought it down: check nothing is left
                pass
            assert not sorted({pid for p in procs for pid in lr.session_members(p)}), "local Ray processes left"


def _submit(cli, run: str, crash_file) -> None:
    code, out, err = cli("submit", "--address", ADDRESS, "--name", NAME, "--run", run, "--nodes", "1",
                         "--num-rollout", "40", "--extra-args", "--save-interval 2", "--miles-commit", "abc123",
                         "--allow-miles-drift", "--no-follow", "-o", "json",
                         "--env", "MILESRAY_TEST_STEP_SECONDS=0.5", "--env", f"MILESRAY_TEST_CRASH_ON_FILE={crash_file}")
    assert code == 0, err


def _status(cli, run: str) -> dict:
    return json.loads(cli("status", run, "-o", "json")[1])


def _events(run: str, kind: str) -> list[dict]:
    rec = state.load_record(run)
    return [e for e in LocalSupervisor(run, rec["supervisor"].get("where")).events() if e["event"] == kind]


def test_a_retry_waits_for_the_gpu_worker_and_a_stop_while_waiting_stays_stopped(own_cluster, cli):
    crash = own_cluster / "crash-now"
    for run in ("wait-stop", "wait-ok"):
        _submit(cli, run, crash)
    for run in ("wait-stop", "wait-ok"):
        poll(f"{run} to train a checkpointed step", lambda run=run: "saved checkpoint" in cli("logs", run)[1], 180)

    local = state.local_clusters_dir()
    lr.scale(local, NAME, 0)  # the GPU worker is lost (the test's fault)
    crash.write_text("now\n")  # and the trainers crash (SIGKILL)
    for run in ("wait-stop", "wait-ok"):
        [waiting] = poll(f"{run}'s supervisor to wait for the worker", lambda run=run: _events(run, "waiting_for_workers"),
                         120)
        assert (waiting["have"], waiting["want"]) == (0, 1) and waiting["deadline"]
        info = _status(cli, run)
        assert info["status"] == "PENDING" and info["attempts"][0]["retry"] is True
        assert "killed" in info["attempts"][0]["reason"]

    code, out, err = cli("stop", "wait-stop", "-o", "json")
    assert code == 0, err
    rec = state.load_record("wait-stop")
    assert LocalSupervisor("wait-stop", rec["supervisor"]["where"]).alive() is False

    lr.scale(local, NAME, 1)  # the worker is back
    done = poll("wait-ok to finish", lambda: (lambda s: s if (s.get("supervisor") or {}).get("finished") else None)(
        _status(cli, "wait-ok")), 240)
    assert done["status"] == "SUCCEEDED"
    a1, a2 = done["attempts"]
    # Miles' numbering: with --save-interval 2 the checkpoints are iterations 1, 3, 5, ... (after rollouts 1, 3, 5)
    assert a2["resumed_iteration"] is not None and a2["resumed_iteration"] % 2 == 1 and a2["last_step"] == 39

    info = _status(cli, "wait-stop")  # the worker came back long ago for wait-ok: nothing started wait-stop again
    assert info["status"] == "STOPPED" and len(info["attempts"]) == 1
    sid = rec["submission_id"]
    assert [j["status"] for j in ray_jobs.list_jobs(lr.read_state(local, NAME)["dashboard_url"])
            if (j["job_id"] or "").startswith(sid)] == ["FAILED"]

    # down of the cluster stops the supervisors of its runs: nothing could carry them on, and none may be left
    # waiting for a head that is gone
    crash.unlink()
    _submit(cli, "down-run", crash)
    poll("down-run to train a step", lambda: "step " in cli("logs", "down-run")[1], 180)
    rec = state.load_record("down-run")
    handle = LocalSupervisor("down-run", rec["supervisor"]["where"])
    assert handle.alive() is True
    code, out, err = cli("down", "--backend", "local", "--name", NAME, "-o", "json")
    assert code == 0, err
    assert handle.alive() is False
