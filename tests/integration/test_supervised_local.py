"""Issue 24 on the embedded cluster: runs that finish on their own. On the session's REAL local Ray cluster (fake
GPUs), a supervised run's train.py is the STAND-IN tests/fakes/fake_ckpt_train.py (Miles cannot run here): it prints
Miles' ``step N`` lines, checkpoints as Megatron does (iter dir first, then latest_checkpointed_iteration.txt),
resumes from ``--load`` and crashes when the TEST asks it to (``submit --env``: the fault is injected by the test).
The supervisor is the real program (launchers/supervise.py) as a detached process, talking to the real Jobs API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.local_ray.supervisor import LocalSupervisor
from miles_ray.controller.program import write_program
from miles_ray.core.supervision import parse_events
from tests.conftest import REPO
from tests.infra.fixtures import poll

pytestmark = [pytest.mark.ray]

TARGET = 12  # rollout ids 0..11
INTERVAL = 3  # a checkpoint every 3 steps


@pytest.fixture
def world(env, tmp_path):
    """The session cluster, a Miles checkout whose train.py is the STAND-IN, the shared volume in tmp."""
    root = tmp_path / "miles"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_ckpt_train.py", root / "train.py")  # STAND-IN train.py
    mount = tmp_path / "mnt"
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {mount}\n")
    return {"cluster": env, "mount": mount, "tmp": tmp_path}


def ckpt_dir(world, run: str) -> Path:
    return world["mount"] / "runs" / run / "checkpoints"


def submit_args(world, run: str, *extra: str, env: dict[str, str] | None = None, extra_args: str = "") -> list[str]:
    args = ["submit", "--address", world["cluster"].address, "--run", run, "--nodes", "1", "--num-rollout",
            str(TARGET), "--extra-args", f"--save-interval {INTERVAL} {extra_args}".strip(), "--miles-commit",
            "abc123", "--allow-miles-drift", "--no-follow", "-o", "json", *extra]
    for k, v in (env or {}).items():
        args += ["--env", f"{k}={v}"]
    return args


def status(cli, run: str) -> dict:
    code, out, err = cli("status", run, "-o", "json")
    assert out, err
    return json.loads(out)


def finished(cli, run: str, timeout: float = 240) -> dict:
    """The run's status once its supervisor finished."""
    return poll(f"run {run}'s supervisor to finish",
                lambda: (lambda s: s if (s.get("supervisor") or {}).get("finished") else None)(status(cli, run)),
                timeout, interval=1.0, explain=lambda: _supervisor_output(run))


def _supervisor_output(run: str) -> str:
    d = state.state_dir() / "supervisors" / run
    return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in (d / "events.log", d / "stderr.log")
                     if p.exists())


def run_jobs(world, run: str) -> list[dict]:
    """The run's Ray jobs, read from the head (not through miles-ray's verbs)."""
    sid = state.load_record(run)["submission_id"]
    return [j for j in ray_jobs.list_jobs(world["cluster"].address)
            if j["job_id"] == sid or (j["job_id"] or "").startswith(sid + "-a")]


def steps_by_attempt(world, run: str) -> list[list[int]]:
    """The steps each trainer process trained, in order (the STAND-IN's own account, one line per step)."""
    by_pid: dict[str, list[int]] = {}
    for line in (ckpt_dir(world, run) / ".stand-in-steps").read_text().splitlines():
        pid, step = line.split()
        by_pid.setdefault(pid, []).append(int(step))
    return list(by_pid.values())


def test_a_trainer_that_crashes_once_is_resumed_from_its_last_checkpoint_after_the_cli_is_gone(world, cli):
    """submit runs as its own process and returns (the supervisor is detached); the trainer is SIGKILLed after
    step 7 (Miles' numbering: checkpoints at iterations 2 and 5, after rollouts 2 and 5): attempt 2 loads iteration 5,
    starts at rollout 6 and the run SUCCEEDS."""
    run = "sup-once"
    proc = subprocess.run([sys.executable, "-m", "miles_ray.cli.app",
                           *submit_args(world, run, env={"MILESRAY_TEST_CRASH_AT_STEP": "7"})],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    submitted = json.loads(proc.stdout)
    assert submitted["max_restarts"] == 3 and submitted["status"] == "PENDING"

    info = finished(cli, run)
    assert info["status"] == "SUCCEEDED", info
    a1, a2 = info["attempts"]
    ck = str(ckpt_dir(world, run))
    assert (a1["status"], a1["retry"], a1["last_step"], a1["resumed_from"]) == ("FAILED", True, 7, None)
    assert "killed" in a1["reason"]
    assert (a2["status"], a2["submission_id"], a2["resumed_from"], a2["resumed_iteration"]) == (
        "SUCCEEDED", f"{a1['submission_id']}-a2", ck, 5)
    assert a2["last_step"] == TARGET - 1
    for key in ("started", "ended"):
        assert a1[key] and a2[key]
    first, second = steps_by_attempt(world, run)
    assert first == list(range(0, 8)) and second == list(range(6, TARGET))
    twice = sorted(set(first) & set(second))
    assert twice == [6, 7] and len(twice) <= INTERVAL  # only what came after the last complete checkpoint

    code, out, _ = cli("logs", run)
    assert code == 0
    h1 = out.index(f"== attempt 1 ({a1['submission_id']}) ==")
    h2 = out.index(f"== attempt 2 ({a2['submission_id']}), resumed from {ck} iter 5, from rollout 6 ==")
    assert h1 < out.index("step 7:") < h2 < out.index(f"loaded checkpoint from {ck} at iteration 5") \
        < out.index(f"step {TARGET - 1}:")
    statuses = {j["job_id"]: j["status"] for j in run_jobs(world, run)}
    assert statuses == {a1["submission_id"]: "FAILED", a2["submission_id"]: "SUCCEEDED"}

    code, out, _ = cli("runs", "-o", "json")
    [row] = [r for r in json.loads(out) if r["run"] == run]
    assert row["status"] == "SUCCEEDED" and len(row["attempts"]) == 2
    code, out, _ = cli("status", run)
    assert code == 0 and "SUCCEEDED" in out


def test_a_bad_flag_fails_after_one_attempt_with_the_reason(world, cli):
    run = "sup-badflag"
    code, out, err = cli(*submit_args(world, run, extra_args="--bogus-flag 1"))
    assert code == 0, err
    info = finished(cli, run)
    assert info["status"] == "FAILED"
    [a1] = info["attempts"]
    assert a1["retry"] is False and a1["last_step"] is None
    assert "before its first training step" in a1["why"] and "before its first training step" in info["message"]
    assert len(run_jobs(world, run)) == 1


def test_stop_while_running_stays_stopped(world, cli):
    run = "sup-stop"
    code, out, err = cli(*submit_args(world, run, env={"MILESRAY_TEST_STEP_SECONDS": "2"}))
    assert code == 0, err
    poll("attempt 1 to train a step", lambda: "step 0:" in cli("logs", run)[1], 120)
    code, out, err = cli("stop", run, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["status"] == "STOPPED"
    handle = LocalSupervisor(run, state.load_record(run)["supervisor"]["where"])
    assert handle.alive() is False  # nothing left that could submit another attempt
    info = status(cli, run)
    assert info["status"] == "STOPPED"
    assert [j["status"] for j in run_jobs(world, run)] == ["STOPPED"]
    # submit of the same run finds it: it does not start it again
    code, out, err = cli(*submit_args(world, run, env={"MILESRAY_TEST_STEP_SECONDS": "2"}))
    assert code == 0, err
    assert json.loads(out)["created"] is False and json.loads(out)["status"] == "STOPPED"
    assert [j["status"] for j in run_jobs(world, run)] == ["STOPPED"]


def test_the_restart_budget_spent_fails_listing_every_attempt(world, cli):
    """--max-restarts 1, a trainer SIGKILLed after 4 steps of every attempt (progress each time): attempt 1 trains
    rollouts 0..3 (checkpoint 2), attempt 2 loads iteration 2 and trains 3..6."""
    run = "sup-budget"
    code, out, err = cli(*submit_args(world, run, "--max-restarts", "1", env={"MILESRAY_TEST_CRASH_EVERY": "4"}))
    assert code == 0, err
    info = finished(cli, run)
    assert info["status"] == "FAILED"
    a1, a2 = info["attempts"]
    assert (a1["last_step"], a1["retry"]) == (3, True)
    assert (a2["last_step"], a2["retry"], a2["resumed_iteration"]) == (6, False, 2)
    assert "restart budget is spent" in a2["why"] and "restart budget is spent" in info["message"]
    assert len(run_jobs(world, run)) == 2


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def test_a_supervisor_killed_and_started_again_adopts_the_running_attempt(world, cli, capsys):
    run = "sup-adopt"
    code, out, err = cli(*submit_args(world, run, env={"MILESRAY_TEST_STEP_SECONDS": "0.6"}))
    assert code == 0, err
    poll("attempt 1 to train a step", lambda: "step 0:" in cli("logs", run)[1], 120)
    where = state.load_record(run)["supervisor"]["where"]
    handle = LocalSupervisor(run, where)
    os.kill(where["pid"], signal.SIGKILL)
    poll("the supervisor to be gone", lambda: handle.alive() is False, 30)
    # submit of the same run (as after this machine rebooted) starts it again with the same spec: it adopts
    code, out, err = cli(*submit_args(world, run, env={"MILESRAY_TEST_STEP_SECONDS": "0.6"}))
    assert code == 0, err
    resubmitted = json.loads(out)
    assert resubmitted["created"] is False and "started it again" in resubmitted["warnings"][0]
    again = json.loads(handle.spec_path.parent.joinpath("process.json").read_text())
    assert again["pid"] != where["pid"] and handle.alive() is True
    rss = poll("the restarted supervisor to adopt the attempt", lambda: [
        e for e in handle.events() if e["event"] == "attempt_started" and e.get("adopted")] and _rss_mib(again["pid"]),
        60)
    with capsys.disabled():
        print(f"\nSUPERVISOR_FIGURES local_supervisor_rss_mib={rss:.1f}")
    info = finished(cli, run)
    assert info["status"] == "SUCCEEDED"
    [a1] = info["attempts"]
    assert a1["submission_id"] == state.load_record(run)["submission_id"]
    started = [e for e in handle.events() if e["event"] == "attempt_started"]
    assert [(e["attempt"], e["adopted"]) for e in started] == [(1, False), (1, True)]
    assert len(run_jobs(world, run)) == 1  # never two drivers
    [steps] = steps_by_attempt(world, run)
    assert steps == list(range(TARGET))


def test_a_failed_attempt_is_not_the_runs_end_until_its_supervisor_decides(world, cli):
    """The supervisor paused (SIGSTOP, injected by the test) while attempt 1 trains; the trainer crashes: Ray says the
    attempt's job FAILED, yet ``status`` says PENDING (its supervisor has not decided), never FAILED; resumed
    (SIGCONT), the supervisor retries and the run SUCCEEDS."""
    run = "sup-undecided"
    code, out, err = cli(*submit_args(world, run, env={"MILESRAY_TEST_CRASH_AT_STEP": "4",
                                                      "MILESRAY_TEST_STEP_SECONDS": "0.6"}))
    assert code == 0, err
    poll("attempt 1 to start", lambda: run_jobs(world, run), 120)
    pid = state.load_record(run)["supervisor"]["where"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        poll("attempt 1's job to fail", lambda: [j for j in run_jobs(world, run) if j["status"] == "FAILED"], 180)
        seen = status(cli, run)
        assert seen["status"] == "PENDING" and "deciding whether to retry" in seen["message"], seen
        assert seen["supervisor"]["alive"] is True and not seen["supervisor"]["finished"], seen
        code, out, _ = cli("runs", "-o", "json")
        [row] = [r for r in json.loads(out) if r["run"] == run]
        assert row["status"] == "PENDING", row
    finally:
        os.kill(pid, signal.SIGCONT)
    info = finished(cli, run)
    assert info["status"] == "SUCCEEDED" and len(info["attempts"]) == 2, info


@pytest.mark.parametrize("token, said", [(None, "HTTP 401 (no token"), ("0" * 64, "HTTP 403 (a wrong token")])
def test_the_supervisor_fails_at_once_when_the_head_refuses_its_token(env, tmp_path, token, said):
    """The shipped program against the session's real head (token auth): no token, or a wrong one -> its finished
    event says so and it exits 1 without waiting; nothing is submitted."""
    program = write_program(tmp_path / "program")
    token_file = None
    if token:
        token_file = tmp_path / "token"
        token_file.write_text(token)
    spec = {"run": "refused", "head_url": env.address, "submission_id": "miles-ray-refused-x", "max_restarts": 0,
            "first_job": {"entrypoint": "true"}, "token_file": str(token_file) if token_file else None}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-I", str(program), "--spec", str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    [done] = [e for e in parse_events(proc.stdout) if e["event"] == "finished"]
    assert done["status"] == "FAILED" and said in done["reason"]
    assert not [j for j in ray_jobs.list_jobs(env.address) if (j["job_id"] or "").startswith("miles-ray-refused")]
