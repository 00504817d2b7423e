"""Ray token authentication on the REAL local cluster (the session's, which runs with it as the product default):
a request without the token is refused (401), a wrong one too (403), the cluster's own accepted; every Ray
process of the cluster runs with RAY_AUTH_MODE=token; miles-ray finds the token itself (the local cluster's
state, also behind the dashboard URL run records keep) and never prints it; --ray-auth none opts out with a
warning. The CLI runs in child processes here, so no token this test process knows can help it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.fixtures import http_status

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]


def _mr(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """miles-ray in a child process, with no Ray token or miles-ray config from this one (only ``env``)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("MILES_RAY_", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE"))}
    return subprocess.run([sys.executable, "-m", "miles_ray", *args], env={**base, "PYTHONPATH": str(REPO), **env},
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_local_cluster_refuses_requests_without_its_token(local_ray):
    from miles_ray.adapters import local_ray as lr

    state = lr.read_state(local_ray.state_dir, local_ray.name)
    token = local_ray.token_path.read_text().strip()
    assert state["auth"] == "token" and Path(state["token_path"]) == local_ray.token_path
    assert local_ray.token_path.parent == local_ray.state_dir  # beside the cluster's state ...
    assert stat.S_IMODE(local_ray.token_path.stat().st_mode) == 0o600  # ... readable by its user only
    assert token not in json.dumps(state)  # the state names the file, never the token
    for path in ("/api/jobs/", "/api/v0/nodes", "/api/version"):
        assert http_status(local_ray.address + path) == 401, path
        assert http_status(local_ray.address + path, "not-the-token") == 403, path
        assert http_status(local_ray.address + path, token) == 200, path


def test_every_process_of_the_cluster_runs_with_token_auth(local_ray):
    """Every process of the cluster whose /proc environment is the one `ray start` got (the leaders, GCS,
    raylets, ...) has RAY_AUTH_MODE=token and the token file. Processes forked by a Python forkserver (the
    dashboard's modules) or retitled by setproctitle (ray::DashboardAgent) show another environment in /proc
    and inherit ours in memory: the 401s of the test above are their proof."""
    checked: list[str] = []
    for pid in local_ray.pids():
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # ended meanwhile
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if "RAY_USAGE_STATS_ENABLED" not in env or cmd.startswith("ray::"):
            # /proc shows another environment than the process has: a forkserver child, or a process that
            # setproctitle retitled (ray::...) and whose original environ area it reused
            continue
        assert env.get("RAY_AUTH_MODE") == "token", (pid, cmd[:200])
        assert env.get("RAY_AUTH_TOKEN_PATH") == str(local_ray.token_path), (pid, cmd[:200])
        assert "RAY_AUTH_TOKEN" not in env  # the token goes by path, never in an environment
        checked.append(cmd)
    programs = [c.split(" ", 1)[0].rsplit("/", 1)[-1] for c in checked]
    assert programs.count("gcs_server") == 1 and programs.count("raylet") == 5, programs  # head + 4 workers
    assert sum(" start --block" in c for c in checked) == 5


def test_miles_ray_sends_the_token_of_the_local_cluster_it_names(local_ray, tmp_path):
    """No RAY_AUTH_TOKEN(_PATH) in the environment: miles-ray reads the local cluster's token itself, for
    local://NAME and for its dashboard URL (what run records keep), and prints it nowhere."""
    token = local_ray.token_path.read_text().strip()
    env = {"MILES_RAY_STATE_DIR": str(local_ray.state_root)}
    st = _mr(["status", "--backend", "local", "--name", local_ray.name, "-o", "json"], tmp_path, **env)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["auth"] == "token" and json.loads(st.stdout)["gpu_node_count"] == 4
    outputs = st.stdout + st.stderr
    for address in (f"local://{local_ray.name}", local_ray.address):
        dry = _mr(["submit", "--rehearse", "--nodes", "2", "--address", address, "--dry-run", "server", "-o", "json"],
                  tmp_path, **env)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["problems"] == [] and json.loads(dry.stdout)["topology"]["gpu_node_count"] == 4
        outputs += dry.stdout + dry.stderr
    assert token not in outputs


def test_without_the_token_miles_ray_says_so_in_one_line(local_ray, tmp_path):
    """A head given by URL that miles-ray has no token for: one error line saying the head refused it, exit 1;
    the token from RAY_AUTH_TOKEN_PATH (Ray's own variable) is let in; a wrong RAY_AUTH_TOKEN is refused (403)."""
    token = local_ray.token_path.read_text().strip()
    args = ["submit", "--rehearse", "--nodes", "2", "--address", local_ray.address, "--dry-run", "server", "-o", "json"]
    env = {"MILES_RAY_STATE_DIR": str(tmp_path / "elsewhere")}
    none = _mr(args, tmp_path, **env)
    errors = [ln for ln in none.stderr.splitlines() if ln.startswith("error:")]
    assert none.returncode == 1 and len(errors) == 1 and "Traceback" not in none.stderr, none.stderr
    assert "refused" in errors[0] and "without a Ray token (HTTP 401)" in errors[0], errors
    assert "RAY_AUTH_TOKEN" in none.stderr  # the hint says how to give it
    wrong = _mr(args, tmp_path, RAY_AUTH_TOKEN="0" * 64, **env)
    assert wrong.returncode == 1 and "(HTTP 403)" in wrong.stderr and "0" * 64 not in wrong.stderr, wrong.stderr
    good = _mr(args, tmp_path, RAY_AUTH_TOKEN_PATH=str(local_ray.token_path), **env)
    assert good.returncode == 0, good.stderr
    assert token not in none.stderr + wrong.stderr + good.stdout + good.stderr


def test_up_with_ray_auth_none_warns_and_starts_a_cluster_without_auth(tmp_path):
    from miles_ray.adapters import local_ray as lr

    env = {"MILES_RAY_STATE_DIR": str(tmp_path / "state")}
    name = f"noauth-{os.getpid()}"
    up = _mr(["up", "--backend", "local", "--name", name, "--nodes", "1", "--gpus-per-node", "1", "--ray-auth",
              "none", "--timeout", "240", "-o", "json"], tmp_path, **env)
    try:
        assert up.returncode == 0, up.stderr
        warnings = [ln for ln in up.stderr.splitlines() if ln.startswith("warning:")]
        assert len(warnings) == 1 and "without token authentication" in warnings[0], up.stderr
        status = json.loads(up.stdout)
        assert status["auth"] == "none"
        assert http_status(status["dashboard_url"] + "/api/jobs/") == 200  # what the default prevents
        assert not lr.token_path(tmp_path / "state" / "local", name).exists()
    finally:
        down = _mr(["down", "--backend", "local", "--name", name, "-y"], tmp_path, **env)
        assert down.returncode == 0, down.stderr


def test_the_single_node_jobs_env_gives_its_own_ray_token_auth(tmp_path):
    """--single-node: the upstream launcher starts Ray INSIDE the job's pod (``ray start --head``, dashboard on
    0.0.0.0:8265) and submits to it with ``ray job submit`` in the same pod. The rendered job gives that pod
    RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the token Secret; here a REAL Ray head is started, and a real
    ``ray job submit`` run, with exactly that container env (FAKE kubelet: the secretKeyRef resolved from a dict,
    as the kubelet resolves it from the Secret). The head refuses a request without the token (401); the
    launcher's own submit gets in."""
    import secrets
    import time

    from miles_ray.adapters.local_ray import ports, processes
    from miles_ray.adapters.local_ray.nodes import RAY_ENV
    from miles_ray.core.config import load_config
    from miles_ray.core.recipes import get_recipe
    from miles_ray.core.single_node import build_single_node
    from tests.conftest import IMAGE

    cfg = load_config({"image": IMAGE, "name": "single-auth"}, environ={})
    op, _ = build_single_node(cfg, get_recipe(cfg.recipe), IMAGE)
    token = secrets.token_hex(32)
    secret_store = {("single-auth", "auth_token"): token}  # FAKE kubelet: the Secret the job references
    pod_env: dict[str, str] = {}
    for e in op["component"]["run"]["container"]["env"]:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        pod_env[e["name"]] = secret_store[(ref["name"], ref["key"])] if ref else e["value"]
    assert pod_env["RAY_AUTH_MODE"] == "token" and pod_env["RAY_AUTH_TOKEN"] == token
    assert token not in json.dumps(op)  # by reference only

    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env = {**base, **RAY_ENV, **pod_env}
    taken: set[int] = set()
    dash, gcs, client = (ports.pick_port(taken) for _ in range(3))
    temp = Path(f"/tmp/mr-sn-{os.getpid()}")
    head = processes.spawn_ray_start(
        ["--head", f"--port={gcs}", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0",
         f"--temp-dir={temp}", "--include-dashboard=True", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         "--dashboard-agent-listen-port=0", f"--ray-client-server-port={client}", "--min-worker-port=0",
         "--max-worker-port=0", "--disable-usage-stats"], tmp_path / "head.log", env)
    url = f"http://127.0.0.1:{dash}"
    t0 = time.monotonic()
    try:
        def answers() -> bool:
            try:
                return http_status(url + "/api/jobs/", token) == 200
            except OSError:  # not listening yet
                return False

        while not answers():
            assert not processes.exited(head), processes.tail(tmp_path / "head.log")
            assert time.monotonic() - t0 < 240, processes.tail(tmp_path / "head.log")
            time.sleep(1)
        assert http_status(url + "/api/jobs/") == 401  # anyone else who reaches the pod's 8265
        submit = subprocess.run([processes.ray_executable(), "job", "submit", "--address", url, "--", "python",
                                 "-c", "print('single-node launcher got in')"],
                                env=env, capture_output=True, text=True, timeout=240)
        assert submit.returncode == 0, submit.stderr[-2000:]
        assert "single-node launcher got in" in submit.stdout
        assert token not in submit.stdout + submit.stderr
    finally:
        processes.stop_sessions([head], processes.job_sessions(f"127.0.0.1:{gcs}", head["start_ticks"]))
        subprocess.run(["rm", "-rf", str(temp)], check=False)
    print(f"\nsingle-node auth: head up and job done in {time.monotonic() - t0:.1f}s")
