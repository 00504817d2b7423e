"""Every Miles run on a Polyaxon-made cluster is a Polyaxon run (issue 23, item 2), against real components: the
real Polyaxon API server (haupt sandbox), the embedded Ray cluster (real Ray, fake GPUs), and the run supervisor as
a detached process on this machine (the embedded cluster's supervisor), which loads launchers/polyaxon_report.py.

The session's embedded cluster is made Polyaxon-made through the product's own record of it: its state file says
``via: polyaxon`` with this haupt's host and a project, as ``up --via polyaxon`` records a Kubernetes cluster.

Miles cannot run here (no GPU, no Miles image): train.py is the STAND-IN tests/fakes/fake_metrics_train.py, which
prints Miles-shaped ``step`` / ``rollout`` / ``eval`` / ``perf`` lines and writes Megatron-shaped checkpoint dirs.
What Polyaxon shows is read back through Polyaxon's API (polyaxon's RunClient), never from its files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.polyaxon]

PROJECT = "miles-tracked"
ROLLOUTS = 40
FINAL_WAIT = 420.0  # a loaded 2-core machine took more than 240 s for the first run of the module (its supervisor and reporter start cold)
KINDS = {"step": "train/loss", "rollout": "rollout/raw_reward", "eval": "eval/aime", "perf": "perf/rollout_time"}


@pytest.fixture(scope="module")
def world(local_ray, polyaxon_server, tmp_path_factory):
    """The session cluster, recorded as made through Polyaxon in PROJECT on this haupt (put back as it was after)."""
    from miles_ray.adapters.local_ray import state as lr

    tmp = tmp_path_factory.mktemp("pxtracked")
    root = tmp / "miles"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", root / "train.py")  # STAND-IN train.py
    mount = tmp / "mnt"
    (tmp / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {mount}\n")
    polyaxon_server.create_project(PROJECT)
    before = lr.read_state(local_ray.state_dir, local_ray.name)
    lr.write_state(local_ray.state_dir, local_ray.name, {**before, "via": "polyaxon", "polyaxon_owner": "default",
                                                         "polyaxon_project": PROJECT,
                                                         "polyaxon_host": polyaxon_server.host})
    try:
        yield {"tmp": tmp, "mount": mount, "cluster": local_ray, "haupt": polyaxon_server}
    finally:
        now = lr.read_state(local_ray.state_dir, local_ray.name)
        if now is not None:
            lr.write_state(local_ray.state_dir, local_ray.name,
                           {k: v for k, v in now.items() if k not in ("via", "polyaxon_owner", "polyaxon_project",
                                                                      "polyaxon_host")})


@pytest.fixture
def env(world, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(world["cluster"].state_root))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + [
            "RAY_ADDRESS", "POLYAXON_HOST", "RAY_API_SERVER_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(world["tmp"])
    return world


def submit_args(world, run: str, *extra: str) -> list[str]:
    return ["submit", "--address", world["cluster"].address, "--name", "miles-test", "--run", run, "--nodes", "1",
            "--num-rollout", str(ROLLOUTS), "-o", "json", "--miles-commit", "abc123", "--allow-miles-drift",
            "--dataset-revision", "d1", "--model-revision", "m1", *extra]


def tracked(world):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns

    return TrackedRuns(PolyaxonApi(host=world["haupt"].host), "default", PROJECT)


def wait_final(world, uuid: str, timeout: float = FINAL_WAIT) -> dict:
    """Poll Polyaxon until the run has a final status (bounded)."""
    runs = tracked(world)
    deadline = time.monotonic() + timeout
    while True:
        run = runs.run(uuid)
        if run["status"] in ("succeeded", "failed", "stopped"):
            return run
        assert time.monotonic() < deadline, f"Polyaxon run {uuid} still {run['status']} after {timeout:.0f}s"
        time.sleep(1)


def printed(world, run: str) -> dict:
    """What the stand-in trainer printed, read from its Ray job's logs by the parser runs compare uses."""
    from miles_ray.adapters import state
    from miles_ray.core.metrics import parse_metrics

    rec = state.load_record(run)
    import urllib.request

    req = urllib.request.Request(f"{world['cluster'].address}/api/jobs/{rec['submission_id']}/logs",
                                 headers=world["cluster"].headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return parse_metrics(json.loads(r.read())["logs"])


def check_polyaxon_run(world, run: str) -> dict:
    """The Polyaxon run of ``run`` as its API shows it: SUCCEEDED, non-managed, its inputs, its logs, a metric of
    each kind with the values the trainer printed, the checkpoint lineage."""
    from miles_ray.adapters import state

    rec = state.load_record(run)
    uuid = rec["polyaxon_run_uuid"]
    assert (rec["polyaxon_project"], rec["polyaxon_host"]) == (PROJECT, world["haupt"].host)
    px = wait_final(world, uuid)
    assert px["status"] == "succeeded", px
    from miles_ray.services import runs as run_service

    assert run_service.run_status(run).polyaxon_uuid == uuid  # status RUN names the run's Polyaxon run
    assert px["is_managed"] is False and px["name"] == run
    inputs = px["inputs"]
    assert inputs["command"] == rec["entrypoint"] and "train.py" in inputs["command"]
    assert (inputs["recipe"], inputs["recipe_hash"], inputs["miles_commit"]) == (rec["recipe"], rec["recipe_hash"],
                                                                                 "abc123")
    assert (inputs["model_revision"], inputs["dataset_revision"]) == ("m1", "d1")
    assert inputs["split"] == rec["split"] and inputs.get("image_digest") == rec.get("image_digest")

    runs = tracked(world)
    logs = runs.logs(uuid)
    assert any(line.startswith("STAND-IN train.py") for line in logs), logs[:5]
    assert any(f"step {ROLLOUTS - 1}: " in line for line in logs)

    want = printed(world, run)["metrics"]
    got = runs.metrics(uuid, list(KINDS.values()))
    for kind, name in KINDS.items():
        assert want[name]["kind"] == kind
        points = got[name]
        assert len(points) == want[name]["count"], (name, points)
        assert points[-1] == (want[name]["id"], want[name]["value"]), (name, points[-1], want[name])
    assert px["outputs"]["eval__aime"] == want["eval/aime"]["value"]

    lineage = {a["name"]: a for a in runs.lineage(uuid)}
    ckpt = lineage["checkpoints"]
    assert ckpt["kind"] == "dir" and ckpt["is_input"] is False
    assert ckpt["summary"]["checkpoint_dir"] == rec["checkpoint_dir"]
    assert ckpt["summary"]["latest_iteration"] == str(ROLLOUTS - 1)  # Miles' numbering: saved after the last rollout
    return px


def test_a_direct_run_is_a_polyaxon_run_kept_current_from_the_cluster(env, cli):
    code, out, err = cli(*submit_args(env, "px-a", "--env", "MILESRAY_TEST_FAKE_EVAL_FINAL=0.3"))
    assert code == 0, err
    check_polyaxon_run(env, "px-a")


def test_the_same_after_the_submitting_terminal_was_killed(env):
    """The submitting CLI is SIGKILLed as soon as the run exists (its record names its Polyaxon run): the supervisor
    on the cluster keeps the Polyaxon run current without it."""
    from miles_ray.adapters import state

    args = submit_args(env, "px-b", "--env", "MILESRAY_TEST_FAKE_EVAL_FINAL=0.45", "--follow")
    proc = subprocess.Popen([sys.executable, "-m", "miles_ray", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (state.record_path("px-b").exists() and (state.read_json(state.record_path("px-b")) or {}).get(
                "supervisor", {}).get("where")):
            assert proc.poll() is None, f"submit ended (exit {proc.returncode}) before the run was recorded"
            assert time.monotonic() < deadline, "no run record after 120s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    check_polyaxon_run(env, "px-b")


def test_runs_compare_and_polyaxon_agree_on_the_final_values(env, cli):
    for run in ("px-a", "px-b"):
        assert state_of(run), f"{run} was not submitted (the tests above run first)"
    code, out, err = cli("runs", "compare", "px-a", "px-b", "-o", "json")
    assert code == 0, err
    rows = {m["metric"]: m for m in json.loads(out)["metrics"]}
    assert rows["eval/aime"]["a"] == 0.3 and rows["eval/aime"]["b"] == 0.45
    runs = tracked(env)
    for side, run in (("a", "px-a"), ("b", "px-b")):
        uuid = state_of(run)["polyaxon_run_uuid"]
        got = runs.metrics(uuid, sorted(rows))
        outputs = runs.run(uuid)["outputs"]
        from miles_ray.adapters.polyaxon_api.tracked import polyaxon_metric_name

        for name, row in rows.items():
            assert got[name][-1] == (row[f"{side}_at"], row[side]), (run, name)
            assert outputs[polyaxon_metric_name(name)] == row[side], (run, name)


def until_running(runs, uuid: str, run: str) -> None:
    """Wait (up to 120 s) until the Polyaxon run of ``run`` shows "running" (its supervisor started attempt 1)."""
    deadline = time.monotonic() + 120
    while (px := runs.run(uuid))["status"] != "running":
        assert time.monotonic() < deadline, (px["status"], supervisor_stderr(run))
        time.sleep(0.5)


def supervisor_stderr(run: str) -> str:
    """The last lines the run's supervisor (and its Polyaxon reporter) wrote to stderr."""
    from miles_ray.adapters.local_ray.supervisor import LocalSupervisor

    path = LocalSupervisor(run, state_of(run).get("supervisor", {}).get("where")).dir / "stderr.log"
    return path.read_text()[-3000:] if path.exists() else f"(no {path})"


def state_of(run: str) -> dict:
    from miles_ray.adapters import state

    return state.read_json(state.record_path(run)) or {}


def test_register_links_the_model_version_to_the_run(env, cli):
    rec = state_of("px-a")
    code, out, err = cli("register", "px-a", "--checkpoint", str(ROLLOUTS - 1), "-o", "json")
    assert code == 0, err
    r = json.loads(out)
    assert r["polyaxon_run_uuid"] == rec["polyaxon_run_uuid"] and r["project"] == f"default/{PROJECT}"
    assert r["host"] == env["haupt"].host
    assert r["registered"]["run"] == rec["polyaxon_run_uuid"]
    lineage = {a["name"] for a in tracked(env).lineage(rec["polyaxon_run_uuid"])}
    assert f"checkpoint-iter_{ROLLOUTS - 1:07d}" in lineage and "checkpoints" in lineage


def test_stop_stops_the_ray_job_the_supervisor_and_the_polyaxon_run(env, cli):
    code, out, err = cli(*submit_args(env, "px-stop", "--env", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=2"))
    assert code == 0, err
    uuid = state_of("px-stop")["polyaxon_run_uuid"]
    runs = tracked(env)
    until_running(runs, uuid, "px-stop")  # its supervisor has started attempt 1
    code, out, err = cli("stop", "px-stop", "--yes", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["stopped"] is True
    assert runs.run(uuid)["status"] == "stopped"
    code, out, err = cli("status", "px-stop", "-o", "json")
    assert json.loads(out)["status"] == "STOPPED", out


@pytest.mark.parametrize("change, words", [
    ({"polyaxon_project": "no-such-project"}, "Polyaxon project default/no-such-project not found"),
    ({"polyaxon_host": "http://127.0.0.1:9"}, "unreachable"),
])
def test_a_bad_polyaxon_home_creates_nothing(env, cli, change, words):
    """A project that does not exist, a host that does not answer: one line, no run record, no Ray job, no
    Polyaxon run."""
    from miles_ray.adapters.local_ray import state as lr

    cluster = env["cluster"]
    before = lr.read_state(cluster.state_dir, cluster.name)
    lr.write_state(cluster.state_dir, cluster.name, {**before, **change})
    try:
        code, out, err = cli(*submit_args(env, "px-bad"))
    finally:
        lr.write_state(cluster.state_dir, cluster.name, {**lr.read_state(cluster.state_dir, cluster.name),
                                                        **{k: before[k] for k in change}})
    assert code != 0 and words in err, err
    said = [line for line in err.strip().splitlines() if not line.startswith("[")]  # (progress lines: "[0s] ...")
    assert len(said) == 1 and said[0].startswith("error: ") and "Traceback" not in err, err
    assert not state_of("px-bad")
    import urllib.request

    req = urllib.request.Request(f"{cluster.address}/api/jobs/", headers=cluster.headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        assert not [j for j in json.loads(r.read()) if "px-bad" in (j.get("submission_id") or "")]
    assert not tracked(env).api.runs_named("default", PROJECT, "px-bad")


def test_a_run_that_would_not_be_supervised_still_gets_its_supervisor(env, cli):
    """--max-restarts 0 (never restarted): on a Polyaxon-made cluster its supervisor still runs, to keep the
    Polyaxon run current."""
    code, out, err = cli(*submit_args(env, "px-norestart", "--max-restarts", "0"))
    assert code == 0, err
    rec = state_of("px-norestart")
    assert rec["supervisor"]["max_restarts"] == 0
    check_polyaxon_run(env, "px-norestart")


def test_a_run_stopped_in_polyaxon_stops_its_ray_job(env, cli):
    """Stopping the Polyaxon run (as its UI or 'polyaxon ops stop' does, through its API) stops the Miles run."""
    code, out, err = cli(*submit_args(env, "px-pxstop", "--env", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=1"))
    assert code == 0, err
    uuid = state_of("px-pxstop")["polyaxon_run_uuid"]
    runs = tracked(env)
    until_running(runs, uuid, "px-pxstop")
    runs.api.stop_run("default", PROJECT, uuid)
    deadline = time.monotonic() + 120
    while True:
        code, out, err = cli("status", "px-pxstop", "-o", "json")
        status = json.loads(out)["status"]
        if status not in ("PENDING", "RUNNING"):
            break
        assert time.monotonic() < deadline, out
        time.sleep(1)
    assert status == "STOPPED", out
    assert runs.run(uuid)["status"] == "stopped"


def test_a_supervisor_started_again_reports_each_line_once(env, cli):
    """The run's supervisor is killed mid-run (SIGKILL: a reboot, the OOM killer); submitting the run again starts it
    again, it adopts the running attempt and re-reads its log from the start: Polyaxon still has each log line and
    each metric point once, and the run SUCCEEDED."""
    args = submit_args(env, "px-again", "--env", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=0.5")
    code, out, err = cli(*args)
    assert code == 0, err
    rec = state_of("px-again")
    uuid = rec["polyaxon_run_uuid"]
    runs = tracked(env)
    deadline = time.monotonic() + 120
    while len(runs.logs(uuid)) < 10:  # its reporter has uploaded some lines
        assert time.monotonic() < deadline, runs.run(uuid)
        time.sleep(1)
    pid = int(rec["supervisor"]["where"]["pid"])
    os.kill(pid, signal.SIGKILL)  # started by this test's submit (the CLI runs in this process): its child
    os.waitpid(pid, 0)
    code, out, err = cli(*args)
    assert code == 0, err
    px = check_polyaxon_run(env, "px-again")
    from miles_ray.adapters import state

    import urllib.request

    req = urllib.request.Request(f"{env['cluster'].address}/api/jobs/{state.load_record('px-again')['submission_id']}"
                                 "/logs", headers=env["cluster"].headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        printed_lines = [line for line in json.loads(r.read())["logs"].splitlines() if line.strip()]
    assert runs.logs(uuid) == printed_lines and px["status"] == "succeeded"
