"""The local backend and the Jobs adapter against a REAL multi-process Ray cluster (no mocks).

One session cluster (fixture ``local_ray``): head with 0 GPUs + 4 worker raylets x 8 fake GPUs.
Placement rehearsals run ``launchers/rehearse.py`` as Ray jobs through ``ray_jobs.submit``.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import ray_jobs
from miles_ray.core.errors import ClusterError

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
REHEARSE = REPO / "launchers" / "rehearse.py"
QWEN3_4B_COLOCATED = "--colocate --actor-num-gpus-per-node 8 --rollout-num-gpus-per-engine 2 --num-gpus-per-node 8"


def _result(logs: str) -> dict:
    lines = [ln for ln in logs.splitlines() if ln.startswith("REHEARSAL_RESULT ")]
    assert lines, f"no REHEARSAL_RESULT line in the job logs:\n{logs[-3000:]}"
    return json.loads(lines[-1][len("REHEARSAL_RESULT ") :])


def _rehearse(address: str, args: str, timeout: float = 300) -> tuple[dict, dict, str]:
    job_id, created = ray_jobs.submit(address, f"{sys.executable} {REHEARSE} {args}")
    assert created
    info = ray_jobs.wait(address, job_id, timeout=timeout)
    logs = ray_jobs.logs(address, job_id)
    return info, _result(logs), logs


def _by_ip(result: dict) -> dict[str, dict]:
    return {n["ip"]: n for n in result["nodes"]}


# ------------------------------------------------------------------------------------------
# cluster lifecycle
# ------------------------------------------------------------------------------------------


def test_up_reports_gpu_nodes_and_a_zero_gpu_head(local_ray):
    info = local_ray.info
    assert info["already_running"] is False
    heads = [n for n in info["nodes"] if n["is_head"]]
    workers = [n for n in info["nodes"] if not n["is_head"]]
    assert len(heads) == 1 and heads[0]["gpus"] == 0 and heads[0]["cpus"] >= 1
    assert [(n["index"], n["gpus"]) for n in workers] == [(i, 8.0) for i in range(1, 5)]
    assert all(n["cpus"] >= n["gpus"] for n in workers)
    assert info["total_gpus"] == 32 and info["gpu_node_count"] == 4
    # one loopback address per node, so Miles's (node IP, GPU id) sort groups bundles by node
    assert len({n["ip"] for n in info["nodes"]}) == 5
    topo = ray_jobs.cluster_topology(local_ray.address)
    assert topo["gpu_node_count"] == 4 and topo["gpus_per_node"] == [8.0] and topo["head"]["gpus"] == 0
    assert ray_jobs.ray_version(local_ray.address) == "2.60.0"
    state = json.loads(lr.state_path(local_ray.state_dir, local_ray.name).read_text())
    assert state["ray_version"] == "2.60.0" and state["head"]["pid"] and len(state["workers"]) == 4
    assert len(state["temp_dir"]) < 20


def test_up_again_is_a_no_op(local_ray):
    before = local_ray.pids()
    again = lr.up(local_ray.state_dir, local_ray.name, 4, 8, 8)
    assert again["already_running"] is True
    assert again["dashboard_url"] == local_ray.address
    assert again["head_pid"] == local_ray.info["head_pid"]
    assert local_ray.pids() == before  # no second cluster, not one process more


def test_status(local_ray):
    st = local_ray.status()
    assert st["alive_count"] == 5 and st["gpu_node_count"] == 4 and st["total_gpus"] == 32
    assert st["dashboard_url"] == local_ray.address
    assert all(n.get("process_alive", True) for n in st["nodes"])


def test_status_and_down_of_a_cluster_that_does_not_exist(tmp_path):
    with pytest.raises(ClusterError, match="no local cluster named nothing is running") as exc:
        lr.down(tmp_path, "nothing")
    assert exc.value.exit_code == 1
    with pytest.raises(ClusterError, match="no local cluster named nothing"):
        lr.status(tmp_path, "nothing")


def test_failed_up_leaves_nothing_behind(tmp_path, local_ray):
    before = set(Path("/tmp").glob("mr-*"))
    with pytest.raises(ClusterError, match="not ready within"):
        lr.up(tmp_path, "too-slow", 1, 8, 8, timeout=0.5)
    assert not lr.state_path(tmp_path, "too-slow").exists()
    new = set(Path("/tmp").glob("mr-*")) - before
    assert not [d for d in new if (d / "logs" / "head.log").exists()]  # its temp dir is gone too
    # the session cluster is untouched
    assert local_ray.status()["alive_count"] == 5


def test_unreachable_address_is_one_clear_error():
    with pytest.raises(ClusterError) as exc:
        ray_jobs.submit("http://127.0.0.1:9", "true")
    assert "http://127.0.0.1:9" in str(exc.value) and "miles-ray up --backend local" in str(exc.value)
    with pytest.raises(ClusterError, match="127.0.0.1:9"):
        ray_jobs.cluster_topology("127.0.0.1:9")


# ------------------------------------------------------------------------------------------
# jobs
# ------------------------------------------------------------------------------------------


def test_duplicate_submission_id_returns_the_existing_job(local_ray):
    entry = f"{sys.executable} -c \"print('hello from job')\""
    sid = f"dup-{time.time_ns()}"
    job, created = ray_jobs.submit(local_ray.address, entry, submission_id=sid, metadata={"who": "test"})
    assert (job, created) == (sid, True)
    assert ray_jobs.submit(local_ray.address, entry, submission_id=sid) == (sid, False)
    # a race between two submitters: exactly one creates
    sid2 = f"race-{time.time_ns()}"
    got: list[tuple[str, bool]] = []
    threads = [
        threading.Thread(target=lambda: got.append(ray_jobs.submit(local_ray.address, entry, submission_id=sid2)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [(sid2, False), (sid2, True)]
    ids = [j["job_id"] for j in ray_jobs.list_jobs(local_ray.address)]
    assert ids.count(sid) == 1 and ids.count(sid2) == 1
    info = ray_jobs.wait(local_ray.address, sid, timeout=120)
    assert info["status"] == "SUCCEEDED" and info["metadata"]["who"] == "test"
    streamed = "".join(ray_jobs.follow_logs(local_ray.address, sid))
    assert "hello from job" in streamed


# ------------------------------------------------------------------------------------------
# placement rehearsals (Miles's placement, fake GPUs)
# ------------------------------------------------------------------------------------------


def test_rehearsal_qwen3_4b_colocated_on_2_nodes(local_ray):
    info, res, logs = _rehearse(local_ray.address, f"--actor-num-nodes 2 {QWEN3_4B_COLOCATED} --some-miles-flag 1")
    assert info["status"] == "SUCCEEDED", logs[-3000:]
    assert res["ok"] and res["errors"] == [] and res["bundles"] == 16 and res["engines"] == 8
    assert [n["bundles"] for n in res["nodes"]] == [8, 8]
    assert all(n["trainer_bundles"] == 8 and n["rollout_bundles"] == 8 and n["engines"] == 4 for n in res["nodes"])
    assert all(len(e["nodes"]) == 1 for e in res["engine_layout"])
    assert res["rollout_manager_node"]


def test_rehearsal_qwen3_4b_colocated_on_4_nodes(local_ray):
    info, res, logs = _rehearse(local_ray.address, f"--actor-num-nodes 4 {QWEN3_4B_COLOCATED}")
    assert info["status"] == "SUCCEEDED", logs[-3000:]
    assert res["ok"] and len(res["nodes"]) == 4
    assert all(n["bundles"] == 8 and n["engines"] == 4 for n in res["nodes"])


def test_rehearsal_disaggregated_puts_trainer_and_rollout_on_different_nodes(local_ray):
    info, res, logs = _rehearse(
        local_ray.address,
        "--actor-num-nodes 2 --actor-num-gpus-per-node 8 --rollout-num-gpus 16 "
        "--rollout-num-gpus-per-engine 8 --num-gpus-per-node 8",
    )
    assert info["status"] == "SUCCEEDED", logs[-3000:]
    trainer = {n["ip"] for n in res["nodes"] if n["trainer_bundles"]}
    rollout = {n["ip"] for n in res["nodes"] if n["rollout_bundles"]}
    assert len(trainer) == 2 and len(rollout) == 2 and not trainer & rollout
    assert all(n["trainer_bundles"] in (0, 8) and n["rollout_bundles"] in (0, 8) for n in res["nodes"])
    assert res["engines"] == 2 and all(len(e["nodes"]) == 1 for e in res["engine_layout"])


def test_rehearsal_over_ask_fails_within_its_timeout_with_the_numbers(local_ray):
    t0 = time.monotonic()
    info, res, logs = _rehearse(local_ray.address, f"--actor-num-nodes 8 {QWEN3_4B_COLOCATED} --timeout 5", 120)
    assert info["status"] == "FAILED"
    assert time.monotonic() - t0 < 60
    assert not res["ok"] and res["needed_gpus"] == 64 and res["total_gpus"] == 32 and res["short_gpus"] == 32
    assert res["gpu_nodes"] == 4 and res["needed_nodes"] == 8
    assert "short by 32 GPUs" in logs and "64 GPUs" in logs


BLOCKER = textwrap.dedent(
    """
    import os, sys, time, ray
    from ray.util.placement_group import placement_group
    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto")
    pg = placement_group([{"GPU": 1, "CPU": 1}] * int(sys.argv[1]), strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    print("HELD", flush=True)
    time.sleep(600)
    """
)


def test_scale_up_lets_a_waiting_rehearsal_finish_then_scale_back_by_pid(local_ray, tmp_path):
    address = local_ray.address
    blocker = tmp_path / "hold_gpus.py"
    blocker.write_text(BLOCKER)
    hold, _ = ray_jobs.submit(address, f"{sys.executable} {blocker} 32")  # every GPU of the 4 nodes
    try:
        deadline = time.monotonic() + 90
        while "HELD" not in ray_jobs.logs(address, hold):
            assert ray_jobs.status(address, hold)["status"] in ("PENDING", "RUNNING")
            assert time.monotonic() < deadline, "the blocker never got its GPUs"
            time.sleep(0.5)
        job, _ = ray_jobs.submit(
            address, f"{sys.executable} {REHEARSE} --actor-num-nodes 1 {QWEN3_4B_COLOCATED} --timeout 180"
        )
        ray_jobs.wait(address, job, timeout=60, until=("RUNNING",))
        time.sleep(3)
        assert ray_jobs.status(address, job)["status"] == "RUNNING"  # its placement group waits

        grown = lr.scale(local_ray.state_dir, local_ray.name, 5)
        assert grown["added"] == [5] and grown["gpu_node_count"] == 5 and grown["total_gpus"] == 40
        new_ip = next(n["ip"] for n in grown["nodes"] if n["index"] == 5)

        info = ray_jobs.wait(address, job, timeout=240)
        logs = ray_jobs.logs(address, job)
        assert info["status"] == "SUCCEEDED", logs[-3000:]
        res = _result(logs)
        assert res["ok"] and [n["ip"] for n in res["nodes"]] == [new_ip] and res["nodes"][0]["bundles"] == 8
    finally:
        ray_jobs.stop(address, hold)

    state = json.loads(lr.state_path(local_ray.state_dir, local_ray.name).read_text())
    fifth = next(w for w in state["workers"] if w["index"] == 5)
    assert lr.session_members(fifth)
    shrunk = lr.scale(local_ray.state_dir, local_ray.name, 4)
    assert shrunk["removed"] == [5] and shrunk["gpu_node_count"] == 4
    assert not lr.session_members(fifth)  # its processes are gone (stopped by PID)
    assert any(n["node_id"] == fifth["node_id"] for n in shrunk["dead_nodes"]) or all(
        n["node_id"] != fifth["node_id"] for n in shrunk["nodes"]
    )
    assert ray_jobs.wait(address, hold, timeout=60)["status"] == "STOPPED"


def test_follow_logs_raises_a_clear_error_when_the_head_goes_away(tmp_path):
    """A separate head-only cluster: follow a chatty job, stop the cluster under it."""
    info = lr.up(tmp_path, "short-lived", 0, 0, 1)
    address = info["dashboard_url"]
    try:
        chatty = "import time; [(print('tick', i, flush=True), time.sleep(0.5)) for i in range(600)]"
        job, _ = ray_jobs.submit(address, f'{sys.executable} -c "{chatty}"')
        stream = ray_jobs.follow_logs(address, job)
        seen = ""
        while "tick" not in seen:
            seen += next(stream)
        lr.down(tmp_path, "short-lived", grace=4)  # a head with a running job needs the SIGKILL
        with pytest.raises(ClusterError, match=address.replace(".", r"\.")) as exc:
            for _ in stream:
                pass
        assert "went away" in str(exc.value) or "ended while" in str(exc.value)
    finally:
        if lr.state_path(tmp_path, "short-lived").exists():
            lr.down(tmp_path, "short-lived")
