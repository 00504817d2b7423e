"""Faults injected into real components while miles-ray works, and what it does about them.

| fault | where proven |
|---|---|
| API server stopped and restarted while `up` waits | test_apiserver_restart_while_up_waits (here) |
| 409/422 conflict on scale, retried on fresh state | tests/e2e/test_kube_cli.py::test_scale_conflict_is_retried_on_fresh_state |
| Ray head killed during `logs --follow` | tests/integration/test_local_ray.py::test_follow_logs_raises_a_clear_error_when_the_head_goes_away |
| Ray head killed during `submit` (before/after the job) | test_ray_head_killed_during_submit (here) |
| the head's dashboard killed while `up --backend local` starts a worker | test_head_dashboard_killed_while_a_worker_starts (here) |
| Polyaxon API answering 503 / going away | test_polyaxon_503_then_clear_error_nothing_created, test_polyaxon_goes_away_mid_up (here); adapter level in tests/integration/test_polyaxon_api.py |
| SIGINT/SIGTERM during `up --via kuberay` | test_signal_during_kube_up_then_rerun_reconciles (here) |
| SIGINT/SIGTERM during `submit` | test_signal_during_submit_leaves_nothing_then_rerun_submits_once (here) |
| kill -9 while writing a state file | test_kill_9_while_writing_state_never_tears_a_file (here) |
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from miles_ray.adapters import ray_auth
from tests.conftest import IMAGE
from tests.infra.fixtures import ray_token_secret
from tests.infra.haupt import grant_runs_rbac
from tests.reliability.conftest import REPO, child_env, cli_proc, one_error_line, wait_line

RAY = "2.60.0"


def _up(namespace: str, nodes: int, name: str, *extra: str) -> list[str]:
    return ["up", "--via", "kuberay", "--nodes", str(nodes), "--image", IMAGE, "--ray-version", RAY, "--no-ray-check",
            "--timeout", "150", "--namespace", namespace, "--name", name, *extra]


def _rayclusters(custom_objects, namespace: str) -> list[dict]:
    return custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]


# -- crash while writing state -------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from miles_ray.adapters.state import atomic_write_json
    path = Path(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:
        i += 1
        atomic_write_json(path, {"run": "r", "i": i, "pad": "x" * (i % 50000)})
""")


def test_kill_9_while_writing_state_never_tears_a_file(tmp_path, ledger):
    """A writer loops atomic_write_json; a reader reads in a loop; the writer is SIGKILLed many times at
    random points. Every read is a whole JSON document (never empty, never a prefix)."""
    from miles_ray.adapters.state import read_json

    event = ledger.record("fault", "kill -9 during atomic_write_json")
    target = tmp_path / "runs" / "r.json"
    reads = torn = kills = 0
    stop = threading.Event()
    seen_i: list[int] = []

    def reader() -> None:
        nonlocal reads, torn
        while not stop.is_set():
            try:
                data = read_json(target)
            except Exception:  # noqa: BLE001 - a torn file would land here
                torn += 1
                continue
            if data is not None:
                reads += 1
                if data.get("run") != "r" or len(data["pad"]) != data["i"] % 50000:
                    torn += 1
                seen_i.append(data["i"])

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    env = child_env()
    for round_ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 + (round_ % 4) * 0.07)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    stop.set()
    t.join(5)
    leftovers = [p.name for p in target.parent.iterdir() if p.name != "r.json"]
    event.update(kills=kills, reads=reads)
    assert torn == 0 and reads > 50, (torn, reads)
    assert read_json(target)["run"] == "r"  # the last complete write is what remains
    # temp files of killed writers may remain (named .r.json.*), never a partial r.json
    assert all(n.startswith(".r.json.") for n in leftovers), leftovers


# -- the Kubernetes API server goes away while up waits ----------------------------------------------

class _Paused:
    """SIGSTOP a control-plane process (kwok: pods stay not-Ready, so 'up' keeps waiting); SIGCONT after."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def _fakegpu():
    return sys.modules["miles_ray_fakegpu"]


def _stop_apiserver(fake_k8s) -> dict:
    fg = _fakegpu()
    d = Path(fake_k8s.dir)
    state = json.loads((d / "state.json").read_text())
    rec = state["processes"]["kube-apiserver"]
    os.kill(rec["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 8
    while fg._is_ours_and_alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    if fg._is_ours_and_alive(rec):  # graceful shutdown waits for long requests: then it crashes instead
        os.kill(rec["pid"], signal.SIGKILL)
        time.sleep(0.5)
        fg._is_ours_and_alive(rec)  # reaps it
    assert not fg._is_ours_and_alive(rec), "kube-apiserver did not stop"
    return rec


def _start_apiserver(fake_k8s, rec: dict) -> None:
    fg = _fakegpu()
    d = Path(fake_k8s.dir)
    new = fg._start("kube-apiserver", rec["argv"], d / "logs", None, die_with_parent=True)
    state = json.loads((d / "state.json").read_text())
    state["processes"]["kube-apiserver"] = new  # so the fixture's teardown stops the new one by PID
    fg._write_state(d, state)
    fake_k8s.state["processes"]["kube-apiserver"] = new
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(fake_k8s.kubeconfig))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            client.VersionApi(api).get_code()
            client.CoreV1Api(api).list_namespace(limit=1)
            return
        except Exception:  # noqa: BLE001 - still starting
            time.sleep(0.5)
    raise AssertionError("kube-apiserver did not come back")


@pytest.mark.e2e
def test_apiserver_restart_while_up_waits(kube_env, custom_objects, namespace, shared_volume, tmp_path, ledger):
    ledger.record("fault", "kube-apiserver restart during up")
    kwok_pid = kube_env.pids["kwok"]
    env = child_env(KUBECONFIG=str(kube_env.kubeconfig), MILES_RAY_STATE_DIR=str(tmp_path / "state"))
    with _Paused(kwok_pid):  # pods get scheduled but never Ready: up keeps waiting
        proc = cli_proc(_up(namespace, 2, "restart"), env, tmp_path)
        try:
            wait_line(proc, "created RayCluster", 60)
            rec = _stop_apiserver(kube_env)
            try:
                wait_line(proc, "unreachable; still waiting", 30)
            finally:
                _start_apiserver(kube_env, rec)
        except BaseException:
            proc.kill()
            raise
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "cluster restart created" in out
    [rc] = _rayclusters(custom_objects, namespace)
    assert rc["status"]["readyWorkerReplicas"] == 2


# -- signals during up and submit -----------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_kube_up_then_rerun_reconciles(kube_env, cli, custom_objects, namespace, shared_volume,
                                                     tmp_path, sig, ledger):
    name = f"sig-{sig.name.lower()}"
    env = child_env(KUBECONFIG=str(kube_env.kubeconfig), MILES_RAY_STATE_DIR=str(tmp_path / "state"))
    with _Paused(kube_env.pids["kwok"]):
        proc = cli_proc(_up(namespace, 2, name), env, tmp_path)
        wait_line(proc, "created RayCluster", 60)
        ledger.record("fault", f"{sig.name} during up --via kuberay")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and one_error_line(err) and "interrupted while bringing up" in err, err
        assert "left in place" in err
    else:
        assert proc.returncode == -signal.SIGTERM and "Traceback" not in err
    # re-run (kube_env points MILES_RAY_STATE_DIR at the same tmp_path/state): the same cluster is found
    # and waited for, never a second one
    code, out, err = cli(*_up(namespace, 2, name))
    assert code == 0, err
    assert "already existed" in out
    assert [r["metadata"]["name"] for r in _rayclusters(custom_objects, namespace)] == [name]


def _jobs_with_id(address: str, sid: str) -> int:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address, headers=ray_auth.headers(address))
    return sum(1 for j in client.list_jobs() if j.submission_id == sid)


@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_submit_leaves_nothing_then_rerun_submits_once(local_ray, cli, tmp_path, monkeypatch, sig,
                                                                     ledger):
    """submit waits for GPU nodes that are not there (--wait-for-nodes); a signal arrives; no record and no
    job are left; the same --run then submits exactly one job, and again returns it."""
    state = tmp_path / "state"
    run = f"sig-submit-{sig.name.lower()}"
    env = child_env(MILES_RAY_STATE_DIR=str(state))
    proc = cli_proc(["submit", "--run", run, "--nodes", "8", "--rehearse", "--address", local_ray.address,
                     "--wait-for-nodes", "--timeout", "120", "--no-follow"], env, tmp_path)
    wait_line(proc, "waiting for 8 nodes", 60)
    ledger.record("fault", f"{sig.name} during submit")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM) and "Traceback" not in err, err
    assert not (state / "runs" / f"{run}.json").exists()
    sid = f"miles-ray-miles-{run}"
    assert _jobs_with_id(local_ray.address, sid) == 0
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(state))
    monkeypatch.chdir(tmp_path)
    args = ["submit", "--run", run, "--nodes", "2", "--rehearse", "--address", local_ray.address, "--no-follow",
            "-o", "json"]
    code, out, err = cli(*args)
    assert code == 0 and json.loads(out)["created"] is True, err
    code, out, err = cli(*args)
    assert code == 0 and json.loads(out)["created"] is False, err
    assert _jobs_with_id(local_ray.address, sid) == 1
    code, _, err = cli("stop", run)  # its 2-node rehearsal would go on beside the next tests
    assert code == 0, err


@pytest.mark.ray
def test_ray_head_killed_during_submit(tmp_path, cli, monkeypatch, ledger):
    """A fresh local cluster; its head is SIGKILLed right after the run record is written (before the job
    is submitted): one clear error, no record left. After `down` nothing of that cluster runs, and ONE `up`
    starts a new head (no retry by the test: nothing of the killed head may stand in its way). On it the
    same --run submits once. Its head is then killed right after the job started: a re-run says the head is
    unreachable and neither duplicates the job nor touches the record; `down` then stops the job's driver
    too, which Ray Jobs runs outside the killed head's session."""
    from miles_ray.adapters import local_ray as lr
    from miles_ray.adapters import state as st

    cluster_dir = tmp_path / "cluster"
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    name = "headkill"

    def kill_head() -> dict:
        s = lr.read_state(cluster_dir, name)
        for pid in lr.session_members(s["head"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15  # until the dashboard port no longer answers
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(urllib.request.Request(  # with the token: a 401 is no dead head
                    s["dashboard_url"] + "/api/version", headers=ray_auth.headers(s["dashboard_url"])), timeout=1).close()
                time.sleep(0.2)
            except OSError:
                return s
        raise AssertionError("the killed head still answers")

    def down_leaves_nothing(s: dict) -> bool:
        sessions = [*lr.processes_of(s), *lr.job_sessions_of(s)]
        lr.down(cluster_dir, name)
        return not any(lr.session_members(rec) for rec in sessions) and not lr.state_path(cluster_dir, name).exists()

    info = lr.up(cluster_dir, name, 1, 8, 9, timeout=300)
    try:
        real_create = st.create_record
        killed: list[dict] = []

        def create_then_kill(record):
            path = real_create(record)
            killed.append(kill_head())  # the fault: between the record write and the submit
            return path

        monkeypatch.setattr(st, "create_record", create_then_kill)
        ledger.record("fault", "Ray head killed between record write and submit")  # ok: the test's outcome
        args = ["submit", "--run", "hk", "--nodes", "1", "--rehearse", "--no-follow", "-o", "json"]
        code, out, err = cli(*args, "--address", info["dashboard_url"])
        monkeypatch.setattr(st, "create_record", real_create)
        ok = (len(killed) == 1 and code == 1 and one_error_line(err) and "cannot reach" in err
              and info["dashboard_url"] in err and not st.record_path("hk").exists())  # nothing half-done
        ok = ok and down_leaves_nothing(killed[0])  # its worker, by PID; nothing of the dead head lingers
        assert ok, err

        info = lr.up(cluster_dir, name, 1, 8, 9, timeout=300)  # once: no retry
        address = info["dashboard_url"]
        code, out, err = cli(*args, "--address", address)
        assert code == 0 and json.loads(out)["created"] is True, err
        record_before = st.record_path("hk").read_text()
        event = ledger.record("fault", "Ray head killed right after submit")
        dead = kill_head()  # the fault: right after the submit
        code, out, err = cli(*args, "--address", address)
        ok = (code == 1 and one_error_line(err) and "cannot reach" in err
              and st.record_path("hk").read_text() == record_before)
        drivers = lr.job_sessions_of(dead)  # job drivers that outlived the head (none if the job had ended)
        ok = ok and down_leaves_nothing(dead)
        event["orphaned_drivers"] = len(drivers)
        assert ok, err
    finally:
        if lr.state_path(cluster_dir, name).exists():
            lr.down(cluster_dir, name)


# -- Polyaxon answering 503 or going away --------------------------------------------------------------

class _Front:
    """A real HTTP proxy on 127.0.0.1 in front of the real sandbox. ``rule(method, path, n)`` returns
    'forward', '503' or 'drop' (close the connection without an answer)."""

    def __init__(self, upstream: str, rule) -> None:
        self.upstream, self.rule, self.seen, self.posts = upstream, rule, 0, 0
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _handle(self):
                front.seen += 1
                front.posts += self.command == "POST"
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                action = front.rule(self.command, self.path, front.seen)
                if action == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if action == "503":
                    data = b'{"detail": "service unavailable"}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                req = urllib.request.Request(front.upstream + self.path, data=body, method=self.command)
                for h in ("Content-Type", "Authorization"):
                    if self.headers.get(h):
                        req.add_header(h, self.headers[h])
                encoding = None
                try:
                    with urllib.request.urlopen(req, timeout=15) as r:
                        status, data, encoding = r.status, r.read(), r.headers.get("Content-Encoding")
                except urllib.error.HTTPError as e:
                    status, data, encoding = e.code, e.read(), e.headers.get("Content-Encoding")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def px(fake_k8s, polyaxon_server, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project("miles-rel")
    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-rel\n")
    fronts: list[_Front] = []

    def front(rule) -> _Front:
        f = _Front(polyaxon_server.host, rule)
        fronts.append(f)
        monkeypatch.setenv("POLYAXON_HOST", f.host)
        return f

    yield front
    for f in fronts:
        f.close()


def _px_up(namespace: str, name: str) -> list[str]:
    return ["up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY, "--namespace", namespace,
            "--name", name, "-c", "px.yaml", "--no-wait"]


def _nothing_created(polyaxon_server, name: str, state: Path) -> bool:
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    runs = PolyaxonApi(host=polyaxon_server.host).runs_named("default", "miles-rel", name)
    return runs == [] and not list((state / "clusters").rglob(f"{name}.json"))


@pytest.mark.e2e
@pytest.mark.polyaxon
def test_polyaxon_503_then_clear_error_nothing_created(px, polyaxon_server, cli, k8s_api, core_v1, namespace, tmp_path,
                                                        ledger):
    ray_token_secret(core_v1, namespace, "px-503")  # the token Secret preflight passes; Polyaxon is what fails
    grant_runs_rbac(k8s_api, namespace)  # and the runs' service account check (up's preflight) too
    ledger.record("fault", "Polyaxon API answers 503")
    front = px(lambda method, path, n: "503" if method == "POST" else "forward")
    t0 = time.monotonic()
    code, out, err = cli(*_px_up(namespace, "px-503"))
    elapsed = time.monotonic() - t0
    assert code == 1 and one_error_line(err), err
    assert "HTTP 503" in err and "4 attempt(s)" in err
    assert front.posts == 4  # bounded: 1 + 3 retries
    assert elapsed >= 0.5 + 1 + 2  # exponential backoff between the attempts
    assert _nothing_created(polyaxon_server, "px-503", tmp_path / "state")


@pytest.mark.e2e
@pytest.mark.polyaxon
def test_polyaxon_goes_away_mid_up(px, polyaxon_server, cli, k8s_api, core_v1, namespace, tmp_path, ledger):
    """The server answers the project and connection checks, then every connection is cut."""
    ray_token_secret(core_v1, namespace, "px-gone")
    grant_runs_rbac(k8s_api, namespace)
    first_post = {"n": None}

    def rule(method, path, n):
        if method == "POST" and first_post["n"] is None:
            first_post["n"] = n
        return "drop" if first_post["n"] is not None else "forward"

    ledger.record("fault", "Polyaxon API goes away")
    front = px(rule)
    code, out, err = cli(*_px_up(namespace, "px-gone"))
    assert code == 1 and one_error_line(err), err
    assert "unreachable" in err.lower() or "attempt(s)" in err
    assert _nothing_created(polyaxon_server, "px-gone", tmp_path / "state")
    _ = (front, REPO)


def test_head_dashboard_killed_while_a_worker_starts(tmp_path, ledger):
    """The head's dashboard dies (SIGKILL, as when a GCS starved of CPU takes it down) while `up --backend local`
    starts worker 1: up does not retry that worker against a dead head for minutes; it says the head stopped
    answering, stops every process of the first try by PID, starts the whole cluster again, and returns with both
    workers ALIVE. The first try's processes are all gone."""
    from miles_ray.adapters import local_ray as lr

    cluster_dir, name = tmp_path / "cluster", "dashkill"
    lines: list[str] = []
    first_head: list[dict] = []

    def progress(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("starting worker node 1/2") and not first_head:  # the fault, once
            s = lr.read_state(cluster_dir, name)
            first_head.append(s["head"])
            dash = [pid for pid in lr.session_members(s["head"]) if "dashboard/dashboard.py" in _cmdline(pid)]
            assert len(dash) == 1, dash
            os.kill(dash[0], signal.SIGKILL)

    ledger.record("fault", "the head's dashboard SIGKILLed while up starts a worker")  # ok: the test's outcome
    t0 = time.monotonic()
    try:
        info = lr.up(cluster_dir, name, 2, 2, 2, progress=progress, timeout=900)
        took = time.monotonic() - t0
        restarted = [ln for ln in lines if "stopping the cluster and starting it again (attempt 2/2)" in ln]
        # said at once, from the head's own `ray start` (it exits within a second of its dashboard), not after
        # HEAD_GONE_SECONDS of refused connections
        assert len(restarted) == 1 and "the head node stopped answering while worker node 1 started" in restarted[0] \
            and f"the head node's `ray start` (PID {first_head[0]['pid']}) has exited" in restarted[0], lines
        assert info["gpu_node_count"] == 2 and [n["state"] for n in info["nodes"]] == ["ALIVE"] * 3, info
        assert not [ln for ln in lines if "attempt 2/3" in ln], lines  # no worker retried against the dead head
        assert not lr.session_members(first_head[0]), "the first head's processes are still there"
        print(f"dashboard killed: up took {took:.0f}s with one cluster restart")
    finally:
        if lr.state_path(cluster_dir, name).exists():
            s = lr.read_state(cluster_dir, name)
            sessions = [*lr.processes_of(s), *lr.job_sessions_of(s)]
            lr.down(cluster_dir, name)
            assert not any(lr.session_members(rec) for rec in sessions), "local Ray processes left"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
