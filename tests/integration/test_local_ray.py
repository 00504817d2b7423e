"""The local backend and the Jobs adapter against a REAL multi-process Ray cluster (no mocks).

One session cluster (fixture ``local_ray``): head with 0 GPUs + 4 worker raylets x 8 fake GPUs.
Placement rehearsals run ``launchers/rehearse.py`` as Ray jobs through ``ray_jobs.submit``.
Start-up retries are proven with real faults: a node's ``ray start`` session is SIGKILLed while it
starts (found through the state file ``up`` writes before it waits), never through a product switch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from miles_ray.adapters import local_ray as lr
from miles_ray.adapters import ray_auth, ray_jobs
from miles_ray.core.errors import ClusterError
from tests.infra.upstream_placement import expected, expected_on, observed

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


def _wait_until(what: str, probe, timeout: float, poll: float = 0.5):
    """Poll ``probe()`` until it returns something truthy; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(poll)


def _placement_groups(address: str, job_id: str) -> list[dict]:
    """The placement groups a Ray job created, from the state API (``/api/v0/placement_groups``)."""
    url = f"{address}/api/v0/placement_groups?limit=10000&detail=true"
    with urllib.request.urlopen(urllib.request.Request(url, headers=ray_auth.headers(address)), timeout=10) as resp:
        rows = json.load(resp)["data"]["result"]["result"]
    return [r for r in rows if r.get("creator_job_id") == job_id]


def _group_in_state(address: str, job: str, state: str, bundles: int) -> dict | None:
    """The job's one placement group once it is in ``state`` with ``bundles`` bundles, else None."""
    info = ray_jobs.status(address, job)
    assert info["status"] in ("PENDING", "RUNNING"), info
    if not info["ray_job_id"]:
        return None
    groups = _placement_groups(address, info["ray_job_id"])
    assert len(groups) <= 1, groups
    if groups and groups[0]["state"] == state and len(groups[0]["bundles"]) == bundles:
        return groups[0]
    return None


def _ray_start_processes(marker: str) -> list[int]:
    """PIDs of live ``ray start`` processes whose command line contains ``marker`` (a node name prefix)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " start --block" in cmd and marker in cmd:
            found.append(int(entry))
    return found


def _kill_session(record: dict) -> dict:
    for pid in lr.session_members(record):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return record


# ------------------------------------------------------------------------------------------
# cluster lifecycle
# ------------------------------------------------------------------------------------------


def test_up_reports_gpu_nodes_and_a_zero_gpu_head(local_ray):
    info = local_ray.info
    assert info["already_running"] is False
    heads = [n for n in info["nodes"] if n["is_head"]]
    workers = [n for n in info["nodes"] if not n["is_head"]]
    assert len(heads) == 1 and heads[0]["gpus"] == 0 and heads[0]["cpus"] == lr.HEAD_CPUS
    assert [(n["index"], n["gpus"], n["cpus"]) for n in workers] == [(i, 8.0, 8.0) for i in range(1, 5)]
    assert [n["ip"] for n in info["nodes"]] == [lr.node_ip(i) for i in range(5)]
    assert info["total_gpus"] == 32 and info["gpu_node_count"] == 4
    # one loopback address per node, so Miles's (node IP, GPU id) sort groups bundles by node
    assert len({n["ip"] for n in info["nodes"]}) == 5
    topo = ray_jobs.cluster_topology(local_ray.address)
    assert topo["gpu_node_count"] == 4 and topo["gpus_per_node"] == [8.0] and topo["head"]["gpus"] == 0
    assert ray_jobs.ray_version(local_ray.address) == "2.60.0"
    state = json.loads(lr.state_path(local_ray.state_dir, local_ray.name).read_text())
    assert state["ray_version"] == "2.60.0" and state["head"]["pid"] and len(state["workers"]) == 4
    assert state["starting"] == [] and state["phase"] == "running"
    assert len(state["temp_dir"]) < 20
    # the ports fixed before the head started lie outside the kernel's ephemeral range, where no
    # outgoing connection can take them before Ray binds them
    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    fixed = [int(state["gcs_address"].rsplit(":", 1)[1]), int(state["dashboard_url"].rsplit(":", 1)[1])]
    assert all(not lo <= port <= hi for port in fixed), (fixed, lo, hi)


def test_gpu_node_wait_counts_only_the_nodes_it_is_told_exist(local_ray):
    """On Kubernetes the wait for GPU workers counts only the worker pods that exist now (``among``): a
    deleted pod's Ray node stays ALIVE until its health check fails. Here: 4 real ALIVE GPU raylets, told
    that one of them is gone -> not enough, and the progress says why; told all four -> done."""
    gpu = sorted(n["ip"] for n in ray_jobs.cluster_topology(local_ray.address)["nodes"] if n["gpus"] >= 8)
    assert len(gpu) == 4 == len(set(gpu))
    said: list[str] = []
    with pytest.raises(ClusterError) as e:
        ray_jobs.wait_for_gpu_nodes(local_ray.address, 4, 8, timeout=1, progress=said.append, poll=0.2,
                                    among=lambda: set(gpu[1:]))
    assert "only 3 of 4 nodes with 8 GPUs joined" in str(e.value)
    assert said == ["waiting for 4 nodes with 8 GPUs: 3 ready (1 more still ALIVE in Ray from pods that are gone)"]
    topo = ray_jobs.wait_for_gpu_nodes(local_ray.address, 4, 8, timeout=5, among=lambda: set(gpu))
    assert sorted(n["ip"] for n in topo["nodes"] if n["gpus"] >= 8) == gpu


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
    """A budget too short for one head start: one error line naming the node, its IP and its log;
    no process, no state file and no temp dir left."""
    before = set(Path("/tmp").glob("mr-*"))
    with pytest.raises(ClusterError) as exc:
        lr.up(tmp_path, "too-slow", 1, 8, 8, timeout=0.5)
    log = lr.failure_log_path(tmp_path, "too-slow", "head")
    msg = str(exc.value)  # what the dashboard last said, if anything, comes between
    assert msg.startswith(f"local Ray head node ({lr.HEAD_IP}) did not start after 1 attempt: not ready within 0.5s")
    assert msg.endswith(f"; log: {log}") and "\n" not in msg and exc.value.exit_code == 1
    assert log.read_text().startswith("=== head, attempt 1: not ready within 0.5s")
    assert not lr.state_path(tmp_path, "too-slow").exists()
    assert _ray_start_processes("--node-name=too-slow-") == []
    new = set(Path("/tmp").glob("mr-*")) - before
    assert not [d for d in new if (d / "logs" / "head.log").exists()]  # its temp dir is gone too
    # the session cluster is untouched
    assert local_ray.status()["alive_count"] == 5


def _kill_starting_nodes(state_dir: Path, name: str, which: str, times: int, stop: threading.Event) -> list[dict]:
    """A fault injector: SIGKILL the session of the ``which`` node ("head" or "starting") each time
    ``up`` records a new start attempt of it, ``times`` times; returns the killed session records."""
    killed: list[dict] = []
    seen: set[int] = set()
    while len(killed) < times and not stop.is_set():
        state = lr.read_state(state_dir, name) or {}
        recs = [state["head"]] if which == "head" and state.get("head") else state.get(which) or []
        for rec in recs:
            if rec["pid"] not in seen and not rec.get("node_id"):  # still starting
                seen.add(rec["pid"])
                killed.append(_kill_session(rec))
        time.sleep(0.05)
    return killed


def test_a_worker_killed_while_starting_is_stopped_and_retried(tmp_path):
    """Worker 1's first start attempt is SIGKILLed: up stops what is left of it by PID, says so, starts it
    again and ends with exactly 1 head + 1 worker; down then leaves nothing."""
    lines: list[str] = []
    stop = threading.Event()
    killed: list[dict] = []
    injector = threading.Thread(
        target=lambda: killed.extend(_kill_starting_nodes(tmp_path, "retry-worker", "starting", 1, stop))
    )
    injector.start()
    try:
        info = lr.up(tmp_path, "retry-worker", 1, 8, 8, progress=lines.append, timeout=300)
    finally:
        stop.set()
        injector.join()
    try:
        assert len(killed) == 1 and killed[0]["index"] == 1, killed
        assert lr.session_members(killed[0]) == []  # the failed attempt's session is gone
        retried = [ln for ln in lines if ln.startswith(f"worker node 1 ({lr.node_ip(1)}) did not start (attempt 1/3: ")]
        assert len(retried) == 1 and retried[0].endswith("stopped it, retrying in 2s"), lines
        assert any(ln.startswith(f"starting worker node 1/1 ({lr.node_ip(1)}") and ln.endswith("attempt 2/3")
                   for ln in lines), lines
        assert info["alive_count"] == 2 and info["gpu_node_count"] == 1 and info["total_gpus"] == 8
        state = lr.read_state(tmp_path, "retry-worker")
        assert state["starting"] == [] and [w["index"] for w in state["workers"]] == [1]
        assert "=== worker-1, attempt 1: " in lr.failure_log_path(tmp_path, "retry-worker", "worker-1").read_text()
        sessions = lr.processes_of(state)
    finally:
        lr.down(tmp_path, "retry-worker")
    assert [lr.session_members(rec) for rec in sessions] == [[], []]
    assert not lr.state_path(tmp_path, "retry-worker").exists()


def test_a_head_that_never_starts_fails_after_its_attempts_with_one_line(tmp_path):
    """Every start attempt of the head is SIGKILLed: after the last one, one error line names the head,
    its IP and its log (holding every attempt); no process, state file or temp dir is left."""
    stop = threading.Event()
    killed: list[dict] = []
    injector = threading.Thread(
        target=lambda: killed.extend(_kill_starting_nodes(tmp_path, "dead-head", "head", lr.START_ATTEMPTS, stop))
    )
    injector.start()
    lines: list[str] = []
    try:
        with pytest.raises(ClusterError) as exc:
            lr.up(tmp_path, "dead-head", 1, 8, 8, progress=lines.append, timeout=300)
    finally:
        stop.set()
        injector.join()
    log = lr.failure_log_path(tmp_path, "dead-head", "head")
    msg = str(exc.value)
    assert msg.startswith(f"local Ray head node ({lr.HEAD_IP}) did not start after 3 attempts: `ray start` exited")
    assert msg.endswith(f"; log: {log}") and "\n" not in msg
    assert len(killed) == 3 and len({rec["pid"] for rec in killed}) == 3
    retries = [ln for ln in lines if ln.startswith(f"head node ({lr.HEAD_IP}) did not start (attempt ")]
    assert [ln.split("(attempt ", 1)[1][:3] for ln in retries] == ["1/3", "2/3"], lines
    assert [f"=== head, attempt {i}: `ray start` exited" in log.read_text() for i in (1, 2, 3)] == [True] * 3
    assert not lr.state_path(tmp_path, "dead-head").exists()
    assert _ray_start_processes("--node-name=dead-head-") == []
    assert [lr.session_members(rec) for rec in killed] == [[], [], []]


def test_up_after_an_up_killed_half_way_starts_afresh(tmp_path):
    """An `up` process SIGKILLed after its head came up (its nodes live on in their own sessions): the next
    `up` of that name stops what the dead one left, by PID, and starts a whole new cluster."""
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys; from miles_ray.adapters import local_ray as lr; "
        f"lr.up({str(tmp_path)!r}, 'half', 2, 8, 8, timeout=600)")])
    try:
        first = _wait_until("the first up's head ready, workers still starting", lambda: (
            (st := lr.read_state(tmp_path, "half")) and (st.get("head") or {}).get("node_id")
            and st["phase"] == "starting" and st), 300, poll=0.1)
        child.kill()
    finally:
        child.kill()
        child.wait()
    orphans = lr.processes_of(lr.read_state(tmp_path, "half"))
    assert lr.session_members(first["head"])  # the dead up's head lives on
    lines: list[str] = []
    info = lr.up(tmp_path, "half", 2, 8, 8, progress=lines.append, timeout=600)
    try:
        assert lines[0] == "removing leftovers of a stopped or half-started local cluster 'half'"
        assert info["already_running"] is False and info["gpu_node_count"] == 2
        assert info["head_pid"] != first["head"]["pid"]
        assert [lr.session_members(rec) for rec in orphans] == [[] for _ in orphans]
    finally:
        lr.down(tmp_path, "half")


def test_readiness_takes_5xx_slow_and_broken_answers_as_not_ready_yet(monkeypatch):
    """Readiness polling against a STAND-IN dashboard (a stdlib HTTP server: a real dashboard cannot be made
    to answer 503, hang or cut a reply on demand, as it does while its GCS is overloaded). Each of those
    answers means "not ready yet"; the first good node list ends the wait, without a failure."""
    import http.server

    from miles_ray.adapters.local_ray import nodes as ray_nodes

    monkeypatch.setattr(ray_nodes, "HTTP_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(ray_nodes, "POLL_SECONDS", 0.05)
    good = json.dumps({"data": {"result": {"result": [{"state": "ALIVE", "is_head_node": True}]}}}).encode()
    answers = ["503", "hang", "cut", "good"]
    seen: list[str] = []

    class StandInDashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            kind = answers[min(len(seen), len(answers) - 1)]
            seen.append(kind)
            if kind == "503":
                self.send_error(503, "GCS overloaded")
            elif kind == "hang":
                time.sleep(2.0)  # longer than the request timeout
            elif kind == "cut":
                self.send_response(200)
                self.send_header("Content-Length", str(len(good)))
                self.end_headers()
                self.wfile.write(good[:10])
            else:
                self.send_response(200)
                self.send_header("Content-Length", str(len(good)))
                self.end_headers()
                self.wfile.write(good)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInDashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rows = ray_nodes.poll_nodes(lambda ns: [n for n in ns if n["is_head_node"]], url, budget=60)
    finally:
        server.shutdown()
        server.server_close()
    assert rows == [{"state": "ALIVE", "is_head_node": True}]
    assert seen == answers


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
    assert res["rollout_manager_node"] and res["engine_lock_node"]
    assert observed(res) == expected_on(expected(actor_nodes=2, actor_gpus_per_node=8, gpus_per_node=8,
                                                 gpus_per_engine=2, colocate=True), res["nodes"])


def test_rehearsal_disaggregated_puts_trainer_and_rollout_on_different_nodes(local_ray):
    info, res, logs = _rehearse(
        local_ray.address,
        "--actor-num-nodes 2 --actor-num-gpus-per-node 8 --rollout-num-gpus 16 "
        "--rollout-num-gpus-per-engine 8 --num-gpus-per-node 8",
    )
    assert info["status"] == "SUCCEEDED", logs[-3000:]
    # bundles sort by (node IP, GPU id) and the trainer takes the first 16: the two lowest node IPs
    assert [n["ip"] for n in res["nodes"]] == [lr.node_ip(i) for i in range(1, 5)]
    assert [(n["trainer_bundles"], n["rollout_bundles"]) for n in res["nodes"]] == [(8, 0), (8, 0), (0, 8), (0, 8)]
    assert res["engines"] == 2 and all(len(e["nodes"]) == 1 for e in res["engine_layout"])
    assert observed(res) == expected_on(expected(actor_nodes=2, actor_gpus_per_node=8, gpus_per_node=8,
                                                 rollout_gpus=16, gpus_per_engine=8), res["nodes"])
    ips = [n["ip"] for n in res["nodes"]]
    assert [(t["node"], t["gpu"]) for t in res["trainer_ranks"]] == [(ips[r // 8], r % 8) for r in range(16)]


# Hand-worked from upstream's rules (tests/infra/upstream_placement.py says which): flags; the expectation's
# arguments; bundles; trainer rank -> (node, GPU) and engine actors (group, engine, node of the engine, node, GPU),
# nodes as ordinals of the nodes used (sorted by IP); fields of the result.
G8 = "--num-gpus-per-node 8 --actor-num-gpus-per-node 8"
ONE_NODE = [(0, g) for g in range(8)]
TWO_NODES = [(k, g) for k in range(2) for g in range(8)]
PLACEMENT_CASES = [
    pytest.param(f"--colocate --actor-num-nodes 2 {G8} --rollout-num-gpus-per-engine 16",
                 dict(actor_nodes=2, gpus_per_engine=16, colocate=True), 16, TWO_NODES,
                 [("rollout", 0, 0, 0, 0), ("rollout", 0, 1, 1, 0)],
                 {"mode": "colocate", "engines": 1, "engine_actors_planned": 2}, id="wide-engine-colocated"),
    pytest.param(f"--actor-num-nodes 1 {G8} --rollout-num-gpus 16 --rollout-num-gpus-per-engine 16",
                 dict(actor_nodes=1, rollout_gpus=16, gpus_per_engine=16), 24, ONE_NODE,
                 [("rollout", 0, 0, 1, 0), ("rollout", 0, 1, 2, 0)],
                 {"mode": "disaggregate", "engines": 1}, id="wide-engine-disaggregated"),
    pytest.param(f"--actor-num-nodes 1 {G8} --rollout-num-gpus 8 --rollout-num-gpus-per-engine 4 "
                 "--eval-num-gpus 8 --eval-num-gpus-per-engine 2",
                 dict(actor_nodes=1, rollout_gpus=8, gpus_per_engine=4, eval_gpus=8, eval_gpus_per_engine=2), 24,
                 ONE_NODE, [("rollout", 0, 0, 1, 0), ("rollout", 1, 0, 1, 4)] + [("eval", k, 0, 2, 2 * k) for k in range(4)],
                 {"eval_gpus": 8, "eval_engines": 4}, id="eval-fleet"),
    pytest.param(f"--colocate --actor-num-nodes 1 {G8} --rollout-num-gpus-per-engine 2 --debug-train-only",
                 dict(actor_nodes=1, gpus_per_engine=2, colocate=True, debug_train_only=True), 8, ONE_NODE, [],
                 {"mode": "debug-train-only", "engines": 0}, id="debug-train-only"),
    pytest.param(f"--actor-num-nodes 3 {G8} --rollout-num-gpus 8 --rollout-num-gpus-per-engine 2 --debug-rollout-only",
                 dict(actor_nodes=3, rollout_gpus=8, gpus_per_engine=2, debug_rollout_only=True), 8, ONE_NODE,
                 [("rollout", k, 0, 0, 2 * k) for k in range(4)],
                 {"mode": "debug-rollout-only", "trainer_gpus": 8, "actor_num_nodes": 1}, id="debug-rollout-only"),
    pytest.param(f"--colocate --actor-num-nodes 1 {G8} --rollout-num-gpus-per-engine 2 --advantage-estimator ppo "
                 "--pin-rollout-manager-to-head",
                 dict(actor_nodes=1, gpus_per_engine=2, colocate=True, ppo=True), 8, ONE_NODE,
                 [("rollout", k, 0, 0, 2 * k) for k in range(4)],
                 {"critic": True, "pin_rollout_manager_to_head": True}, id="critic-and-pinned-manager"),
    pytest.param(f"--colocate --actor-num-nodes 1 {G8} --rollout-external --rollout-external-engine-addrs 10.9.9.9:30000",
                 dict(actor_nodes=1, colocate=True, rollout_external=True), 8, ONE_NODE, [],
                 {"mode": "rollout-external", "external_engines": 1, "engines": 0}, id="rollout-external"),
]


@pytest.mark.parametrize(("flags", "upstream", "bundles", "trainer", "engines", "fields"), PLACEMENT_CASES)
def test_rehearsal_places_what_upstream_places(local_ray, flags, upstream, bundles, trainer, engines, fields):
    info, res, logs = _rehearse(local_ray.address, flags)
    assert info["status"] == "SUCCEEDED" and res["ok"], logs[-3000:]
    # the independent expectation from upstream's rules, on the bundles this run got
    exp = expected(**{"actor_gpus_per_node": 8, "gpus_per_node": 8, **upstream})
    got = observed(res)
    assert got == expected_on(exp, res["nodes"])
    # and the hand-worked table (whole nodes: each used node holds GPUs 0-7)
    ips = [n["ip"] for n in res["nodes"]]
    assert len(ips) == bundles // 8 and all(n["gpu_ids"] == list(range(8)) for n in res["nodes"])
    assert got["bundles"] == bundles and got["trainer"] == [(ips[k], g) for k, g in trainer]
    assert got["engines"] == sorted((grp, e, j, ips[k], g) for grp, e, j, k, g in engines)
    assert got["critic"] == (got["trainer"] if upstream.get("ppo") else [])
    assert {k: res[k] for k in fields} == fields
    assert res["rollout_manager_node"] and res["engine_lock_node"]
    if upstream.get("ppo"):  # pinned: the RolloutManager sits on the head node (0 GPUs), not in the group
        assert res["rollout_manager_node"] == res["head_node"] == lr.node_ip(0)
    assert f"trainer ranks 0-7 on {ips[0]} GPUs 0-7" in logs
    if any(j for _, _, j, _, _ in engines):  # an engine wider than a node
        assert f"rollout engine 0 spans 2 nodes ({ips[-2]}, {ips[-1]}): one actor per node" in logs


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
        _wait_until("the blocker's 32-bundle group CREATED", lambda: _group_in_state(address, hold, "CREATED", 32), 90)
        _wait_until("the blocker holding its GPUs", lambda: "HELD" in ray_jobs.logs(address, hold), 60)
        job, _ = ray_jobs.submit(
            address, f"{sys.executable} {REHEARSE} --actor-num-nodes 1 {QWEN3_4B_COLOCATED} --timeout 180"
        )
        # the rehearsal's 8-bundle group is PENDING: no GPU is free until a node is added
        _wait_until("the rehearsal's 8-bundle group PENDING", lambda: _group_in_state(address, job, "PENDING", 8), 90)

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
    assert fifth["node_id"] not in {n["node_id"] for n in shrunk["nodes"]}
    assert fifth["node_id"] in {n["node_id"] for n in shrunk["dead_nodes"]}  # the state API keeps dead nodes
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
        state = lr.read_state(tmp_path, "short-lived")
        drivers = lr.job_sessions_of(state)  # Ray Jobs runs the entrypoint in a session of its own
        assert len(drivers) == 1 and lr.session_members(drivers[0])
        lr.down(tmp_path, "short-lived", grace=4)  # a head with a running job needs the SIGKILL
        assert lr.session_members(drivers[0]) == []  # down stopped the job driver too: no orphan ticks on
        with pytest.raises(ClusterError, match=address.replace(".", r"\.")) as exc:
            for _ in stream:
                pass
        assert "went away" in str(exc.value) or "ended while" in str(exc.value)
    finally:
        if lr.state_path(tmp_path, "short-lived").exists():
            lr.down(tmp_path, "short-lived")
