"""Issue 27 on the embedded cluster: a job whose head process is killed is lost, never RUNNING. On a REAL local
Ray cluster of this test's own (the session cluster is shared and must never lose its head): the run record keeps
Ray's head node id; the head's node session killed (SIGKILL) under a running rehearsal -> status exits 3 naming
the lost head (its process is not running); submit of the run reaches no head and starts nothing; once the
cluster is down and up again (a new head), submit of the run starts attempt 2, the only driver of the run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import ray_jobs, state
from tests.infra.fixtures import poll

pytestmark = pytest.mark.ray

NAME = "headloss"
ADDRESS = f"local://{NAME}"


@pytest.fixture
def own_cluster(cli, monkeypatch, tmp_path):
    """A 1-worker x 8 fake-GPU local cluster made by 'up --backend local', in this test's state dir; stopped by
    PID at the end whatever happened (its job drivers too)."""
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
            except Exception:  # noqa: BLE001 - the test already brought it down: check nothing is left
                pass
            assert not sorted({pid for p in procs for pid in lr.session_members(p)}), "local Ray processes left"


def _drivers(st: dict) -> list[int]:
    """The live processes of the cluster's Ray Jobs drivers, found in /proc (not through miles-ray's verbs)."""
    return sorted({pid for rec in lr.job_sessions_of(st) for pid in lr.session_members(rec)})


def _submit(cli) -> tuple[int, dict, str]:
    code, out, err = cli("submit", "--address", ADDRESS, "--name", NAME, "--rehearse", "--run", "lostlocal",
                         "--nodes", "1", "--hold", "600", "--no-follow", "-o", "json")
    return code, (json.loads(out) if code == 0 else {}), err


def test_a_job_whose_head_process_is_killed_is_lost_and_submit_starts_attempt_2(own_cluster, cli, capsys):
    code, first, err = _submit(cli)
    assert code == 0 and first["created"] is True, err
    poll("the rehearsal to run", lambda: cli("status", "lostlocal")[0] == 5, 120)
    local = state.local_clusters_dir()
    st = lr.read_state(local, NAME)
    record = state.load_record("lostlocal")
    [head] = [n for n in lr.fetch_nodes(st["dashboard_url"]) if n["is_head_node"] and n["state"] == "ALIVE"]
    assert record["head"] == {"node_id": head["node_id"]}  # Ray's own head node id; no pod on this machine
    poll("the rehearsal's driver to run", lambda: _drivers(st), 120)

    t = time.monotonic()
    for pid in lr.session_members(st["head"]):  # the head's node session: ray start, GCS, raylet, dashboard
        with contextlib.suppress(ProcessLookupError):  # a short-lived member (a worker ending) may be gone already
            os.kill(pid, signal.SIGKILL)
    code, out, err = cli("status", "lostlocal", "-o", "json")
    seconds = time.monotonic() - t
    with capsys.disabled():
        print(f"\nHEAD_LOSS_FIGURES head_killed_to_status_lost_s={seconds:.1f}")
    info = json.loads(out)
    assert code == 3 and info["status"] == "FAILED", (code, out, err)
    assert info["message"].startswith("head lost at ")
    assert f"the head process (pid {st['head']['pid']}) of local cluster {NAME} is not running" in info["message"]
    assert info["head_lost"]["head"] == record["head"] and info["head_lost"]["serving_head"] is None
    code, out, _ = cli("runs", "-o", "json")
    assert code == 0 and [r["status"] for r in json.loads(out) if r["run"] == "lostlocal"] == ["FAILED"]
    code, _, err = cli("logs", "lostlocal")
    assert code == 3 and "head lost at" in err and "Traceback" not in err, err
    code, out, err = cli("doctor", "lostlocal", "-o", "json")
    [run_head] = [f for f in json.loads(out)["findings"] if f["check"] == "run_head"]
    assert code == 4 and run_head["status"] == "problem" and "lost with its head" in run_head["summary"], out

    # no head serves: submit of the run reaches none and starts nothing
    code, _, err = _submit(cli)
    assert code == 1 and "error: the head of local cluster" in err and "unreachable" in err, err
    assert state.load_record("lostlocal")["submission_id"] == first["submission_id"]

    # down (it stops what is left, the orphaned driver too) and up: a new head
    code, _, err = cli("down", "--backend", "local", "--name", NAME, "-o", "json")
    assert code == 0, err
    assert not _drivers(st), "a driver of the lost head is left"
    code, _, err = cli("up", "--backend", "local", "--name", NAME, "--nodes", "1", "-G", "8", "--timeout", "240")
    assert code == 0, err
    code, out, _ = cli("status", "lostlocal", "-o", "json")
    assert code == 3 and json.loads(out)["head_lost"]["attempt"] == 1

    t = time.monotonic()
    code, again, err = _submit(cli)
    assert code == 0, err
    assert again["created"] is True and again["submission_id"] == first["submission_id"] + "-a2", again
    assert any("submitting attempt 2" in w for w in again["warnings"]), again["warnings"]
    new = lr.read_state(local, NAME)

    def runs() -> list[dict]:
        return [j for j in ray_jobs.list_jobs(new["dashboard_url"]) if j["metadata"].get("miles_ray_run") == "lostlocal"]

    poll("attempt 2 to run", lambda: [j["status"] for j in runs()] == ["RUNNING"], 120)
    with capsys.disabled():
        print(f"\nHEAD_LOSS_FIGURES resubmit_to_attempt_2_running_s={time.monotonic() - t:.1f}")
    assert cli("status", "lostlocal")[0] == 5
    record = state.load_record("lostlocal")
    [head2] = [n for n in lr.fetch_nodes(new["dashboard_url"]) if n["is_head_node"] and n["state"] == "ALIVE"]
    assert record["head"] == {"node_id": head2["node_id"]} != {"node_id": head["node_id"]}
    assert [(a["attempt"], a.get("lost")) for a in record["attempts"]] == [(1, True), (2, None)]
    # one driver: the new head's own job list has the run's attempt 2 only, and one driver session runs
    jobs = runs()
    assert [(j["job_id"], j["status"]) for j in jobs] == [(again["submission_id"], "RUNNING")], jobs
    assert len(lr.job_sessions_of(new)) == 1
    # the same submit again: attempt 2 as it runs, nothing new
    code, third, err = _submit(cli)
    assert code == 0 and third["created"] is False and third["submission_id"] == again["submission_id"], err
