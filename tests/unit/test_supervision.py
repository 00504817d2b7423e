"""The run supervisor's pure parts (miles_ray/core/supervision.py): the spec, the events and their fold into a run's
attempts, the failure classifier and the retry decision; and submit's --max-restarts bad input (nothing created)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_ray.controller.program import program_files
from miles_ray.controller import rules
from miles_ray.core import supervision as sv
from tests.infra.fake_ray_head import FakeRayHead, node, shipped_program

SPEC = {"run": "r1", "head_url": "http://127.0.0.1:8265/", "submission_id": "miles-ray-x-r1", "max_restarts": 2,
        "first_job": {"entrypoint": "python3 train.py --save /c"},
        "resume_job": {"entrypoint": "python3 train.py --save /c --load /c", "runtime_env": {"env_vars": {"A": "1"}}},
        "checkpoint_dir": "/c", "gpu_workers": 2, "gpus_per_node": 8}


# -- the spec ---------------------------------------------------------------------------------------------------

def test_spec_round_trips_and_defaults():
    spec = sv.SupervisorSpec.of(SPEC)
    assert spec.head_url == "http://127.0.0.1:8265" and spec.max_restarts == 2 and spec.token_file is None
    assert spec.resume_job.entrypoint.endswith("--load /c") and spec.polyaxon is None
    assert sv.SupervisorSpec.of(json.loads(json.dumps(spec.to_json()))) == spec


@pytest.mark.parametrize("change, fragment", [
    ({"run": ""}, "'run'"),
    ({"head_url": None}, "'head_url'"),
    ({"max_restarts": -1}, "out of range"),
    ({"max_restarts": 101}, "out of range"),
    ({"max_restarts": True}, "not an integer"),
    ({"resume_job": None}, "'resume_job' is needed"),
    ({"first_job": {"entrypoint": ""}}, "'first_job'"),
    ({"gpu_workers": -2}, "'gpu_workers'"),
    ({"poll_seconds": 0}, "'poll_seconds'"),
    ({"colour": "red"}, "unknown spec field(s): colour"),
    ({"schema": "other/v9"}, "schema"),
])
def test_a_bad_spec_is_refused_naming_what(change, fragment):
    with pytest.raises(sv.SpecError, match=None) as e:
        sv.SupervisorSpec.of({**SPEC, **change})
    assert fragment in str(e.value)


def test_attempt_ids():
    assert [sv.attempt_submission_id("s", n) for n in (1, 2, 10)] == ["s", "s-a2", "s-a10"]
    assert [sv.attempt_of("s", x) for x in ("s", "s-a2", "s-a10", "s-a1", "s-ab", "t", "s-a2x")] == [
        1, 2, 10, None, None, None, None]


# -- events -----------------------------------------------------------------------------------------------------

def test_event_lines_parse_back_and_garbage_is_skipped():
    text = "\n".join(["noise", sv.event_line("attempt_started", attempt=1, submission_id="s", started="t0"),
                      sv.EVENT_PREFIX + '{"event": "attempt_ended", "attempt": 1', "  " + sv.event_line(
                          "finished", status="SUCCEEDED", reason="ok"), sv.EVENT_PREFIX + '{"event": "nope"}'])
    assert [e["event"] for e in sv.parse_events(text)] == ["attempt_started", "finished"]
    with pytest.raises(ValueError):
        sv.event_line("nonsense")


def _run_events(n_attempts: int, adopt_repeats: list[int]) -> tuple[list[dict], list[dict]]:
    """The events of a supervisor that ran ``n_attempts`` (the last still running when ``n_attempts`` is odd...),
    restarted while attempt k ran for each k in ``adopt_repeats`` (it then says attempt k started again)."""
    events, want = [], []
    for n in range(1, n_attempts + 1):
        sid = sv.attempt_submission_id("s", n)
        start = {"event": "attempt_started", "attempt": n, "submission_id": sid, "started": f"t{n}",
                 "resumed_from": "/c" if n > 1 else None, "resumed_iteration": 3 * (n - 1) if n > 1 else None}
        events.append(start)
        for _ in range(adopt_repeats.count(n)):
            events.append({**start, "started": f"later{n}", "resumed_iteration": None, "adopted": True})
        last = n == n_attempts
        end = {"event": "attempt_ended", "attempt": n, "submission_id": sid, "status": "SUCCEEDED" if last else
               "FAILED", "ended": f"e{n}", "reason": "why", "last_step": 4 * n, "retry": not last, "why": "w"}
        events.append(end)
        want.append({"attempt": n, "submission_id": sid, "status": end["status"], "started": f"t{n}",
                     "ended": f"e{n}", "reason": "why", "resumed_from": start["resumed_from"],
                     "resumed_iteration": start["resumed_iteration"], "last_step": 4 * n, "retry": not last,
                     "why": "w"})
    return events, want


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), repeats=st.lists(st.integers(1, 6), max_size=5), dup_end=st.integers(0, 6))
def test_fold_one_attempt_per_number_whatever_the_restarts_repeat(n, repeats, dup_end):
    events, want = _run_events(n, repeats)
    if 1 <= dup_end <= n:  # a restarted supervisor says again how an ended attempt ended, and a late start
        end = next(e for e in events if e["event"] == "attempt_ended" and e["attempt"] == dup_end)
        events += [dict(end), {"event": "attempt_started", "attempt": dup_end, "submission_id": "x",
                               "started": "late"}]
    assert sv.fold_attempts(events) == want
    assert sv.final_status(events) is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.fixed_dictionaries({"event": st.sampled_from(sv.EVENTS), "attempt": st.integers(-1, 4)}),
                max_size=30))
def test_fold_never_fails_and_keys_attempts_by_number(events):
    attempts = sv.fold_attempts(events)
    assert [a["attempt"] for a in attempts] == sorted({e["attempt"] for e in events if e["attempt"] >= 1 and e[
        "event"] in ("attempt_started", "attempt_ended")})
    assert all(set(a) == set(sv.ATTEMPT_KEYS) for a in attempts)


def test_a_running_attempt_and_the_final_event():
    events = [{"event": "attempt_started", "attempt": 1, "submission_id": "s", "started": "t"}]
    assert sv.fold_attempts(events)[0]["status"] == "RUNNING"
    events.append({"event": "finished", "status": "STOPPED", "reason": "r"})
    assert sv.final_status(events)["status"] == "STOPPED"


# -- what logs and checkpoints say ----------------------------------------------------------------------------

def test_last_step_and_latest_iteration():
    logs = ("(MegatronTrainRayActor pid=1) [t rank0] actor.py:601 - step 3: {'train/loss': 0.1}\n"
            "rollout 4: {'rollout/raw_reward': 0.2}\nstep 4: {'train/loss': nan}\nstep five: {}\n")
    assert sv.last_step(logs) == 4 and sv.last_step("no steps") is None and sv.last_step(None) is None
    assert [rules.read_latest_iteration(x) for x in ("12\n", "release", "", "x1", None)] == [12, 0, None, None, None]


# -- the classifier -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("message, logs, code, fragment", [
    ("Job supervisor actor died", "", None, "head"),
    ("", "ray.exceptions.NodeDiedError: node abc died", None, "node was lost"),
    ("", "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", 1, "actor"),
    ("", "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", 1, "collective"),
    ("Job entrypoint command failed with exit code 137", "", 137, "killed"),
    ("", "", -9, "killed"),
    ("", "ConnectionError: Failed to connect to GCS at 10.0.0.1:6379", 1, "connection"),
])
def test_failures_worth_retrying(message, logs, code, fragment):
    v = rules.classify("FAILED", message, logs, code)
    assert v.kind == "retryable" and fragment in v.reason


@pytest.mark.parametrize("status, message, logs, kind", [
    ("SUCCEEDED", None, None, "succeeded"),
    ("STOPPED", "Job was intentionally stopped.", None, "stopped"),
    ("FAILED", "Job entrypoint command failed with exit code 2", "train.py: error: unrecognized arguments: --x",
     "failed"),
    ("FAILED", "Job entrypoint command failed with exit code 1", "ModuleNotFoundError: No module named 'miles'",
     "failed"),
    ("FAILED", "", "FileNotFoundError: /data/dapo.jsonl", "failed"),
])
def test_failures_not_worth_retrying(status, message, logs, kind):
    assert rules.classify(status, message, logs, 1 if status == "FAILED" else 0).kind == kind


def test_a_lost_head_is_retryable_whatever_the_logs():
    v = rules.classify("FAILED", lost="Ray head node 1234 is gone")
    assert v.kind == "retryable" and "1234" in v.reason


# -- the decision ---------------------------------------------------------------------------------------------

RETRY = rules.Verdict("retryable", "a Ray node was lost (NodeDiedError)")


@pytest.mark.parametrize("attempt, verdict, step, prev, budget, retry, fragment", [
    (1, RETRY, 7, None, 3, True, "restart 1 of 3"),
    (2, RETRY, 9, 7, 3, True, "restart 2 of 3"),
    (1, RETRY, None, None, 3, False, "before its first training step"),
    (2, RETRY, 7, 7, 3, False, "no progress"),
    (2, RETRY, 5, 7, 3, False, "no progress"),
    (2, RETRY, 9, 7, 1, False, "restart budget is spent"),
    (4, RETRY, 20, 10, 3, False, "restart budget is spent"),
    (1, RETRY, 7, None, 0, False, "restart budget is spent"),
    (1, rules.Verdict("stopped", "s"), 7, None, 3, False, "never started again"),
    (1, rules.Verdict("failed", "exit 1"), 7, None, 3, False, "not a failure worth retrying"),
    (1, rules.Verdict("succeeded", "ok"), 7, None, 3, False, "succeeded"),
])
def test_decide(attempt, verdict, step, prev, budget, retry, fragment):
    d = rules.decide(attempt, verdict, step, prev, budget)
    assert d.retry is retry and fragment in d.why


@settings(max_examples=100, deadline=None)
@given(attempt=st.integers(1, 10), step=st.none() | st.integers(0, 50), prev=st.none() | st.integers(0, 50),
       budget=st.integers(0, 5), kind=st.sampled_from(["retryable", "failed", "stopped", "succeeded"]))
def test_decide_never_retries_what_it_must_not(attempt, step, prev, budget, kind):
    d = rules.decide(attempt, rules.Verdict(kind, "r"), step, prev, budget)
    if d.retry:
        assert kind == "retryable" and step is not None and (prev is None or step > prev) and attempt <= budget


def test_gpu_workers_alive_counts_alive_gpu_nodes_with_enough_gpus():
    rows = [{"state": "ALIVE", "is_head_node": True, "resources_total": {"CPU": 1}},
            {"state": "ALIVE", "resources_total": {"GPU": 8}}, {"state": "DEAD", "resources_total": {"GPU": 8}},
            {"state": "ALIVE", "resources_total": {"GPU": 4}}]
    assert len(rules.gpu_workers_ready(rows, 8)) == 1 and len(rules.gpu_workers_ready(rows, 0)) == 2


# -- the program as shipped -----------------------------------------------------------------------------------

def test_the_shipped_program_needs_nothing_but_its_files(tmp_path):
    """supervise.py with supervision.py and metrics.py beside it, under python3 -I (no site packages, no
    PYTHONPATH): a bad spec exits 2 with one line; its --help works."""
    for name, text in program_files().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "spec.json").write_text(json.dumps({**SPEC, "max_restarts": -1}))
    proc = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "supervise.py"), "--spec",
                           str(tmp_path / "spec.json")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "out of range" in proc.stderr
    proc = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "supervise.py"), "--help"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and "--spec" in proc.stdout


# -- submit's --max-restarts: bad input, nothing created --------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["--max-restarts", "-1"], "--max-restarts -1 is out of range"),
    (["--max-restarts", "101"], "--max-restarts 101 is out of range"),
    (["--max-restarts", "two"], "--max-restarts"),
    (["--max-restarts", "2", "--rehearse"], "--max-restarts means nothing with --rehearse"),
    (["--max-restarts", "0", "--rehearse"], "--max-restarts means nothing with --rehearse"),
    (["--max-restarts", "2", "--mode", "launcher"], "--max-restarts applies to --mode direct"),
])
def test_submit_max_restarts_bad_input(cli, clean_env, args, fragment):
    code, out, err = cli("submit", "--nodes", "1", "--address", "http://127.0.0.1:9", "--dry-run", "client", *args)
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert "Traceback" not in err + out
    assert sorted(p.name for p in clean_env.iterdir()) == []


def test_submit_dry_run_says_whether_a_run_is_supervised(cli, clean_env):
    base = ["submit", "--nodes", "1", "--address", "http://127.0.0.1:9", "--dry-run", "client", "-o", "json"]
    code, out, err = cli(*base)
    assert code == 0, err
    assert json.loads(out)["record"]["supervisor"] == {"kind": "local", "max_restarts": 3}
    code, out, err = cli(*base, "--max-restarts", "0")
    assert code == 0, err
    assert "supervisor" not in json.loads(out)["record"]
    code, out, err = cli(*base, "--rehearse")
    assert code == 0, err
    assert "supervisor" not in json.loads(out)["record"]


# -- the program's own judgement of a job lost with its head (the shipped copy, imported from its dir) ----------

@pytest.fixture(scope="module")
def program(tmp_path_factory):
    with shipped_program(tmp_path_factory.mktemp("program"), "shipped_supervise") as mod:
        yield mod


NODES = [{"node_id": "H2", "state": "ALIVE", "is_head_node": True, "start_time_ms": 5000},
         {"node_id": "W1", "state": "ALIVE"}, {"node_id": "H1", "state": "DEAD", "is_head_node": True}]


@pytest.mark.parametrize("job, attempt_head, lost", [
    ({"driver_node_id": "W1", "start_time": 1000}, "H1", None),  # its driver's node is ALIVE: not lost
    ({"driver_node_id": "H1", "start_time": 6000}, "H1", "is gone"),  # the head it started on is gone
    ({"driver_node_id": None, "start_time": 1000}, None, "started before the head now serving"),  # (adopted)
    ({"driver_node_id": "H1", "start_time": 6000}, "H2", None),  # same head, started after it: not known lost
])
def test_a_job_lost_with_its_head(program, job, attempt_head, lost):
    head = program.rules.head_of(NODES)
    assert head["node_id"] == "H2" and head["alive"] == {"H2", "W1"}
    said = program.rules.lost_with_head(job, head, attempt_head)
    assert (said is None) if lost is None else (lost in said)
    no_head = program.rules.head_of(NODES[1:])
    assert program.rules.lost_with_head(job, no_head, attempt_head) is None  # no head ALIVE yet



def test_the_supervisor_finds_a_job_older_than_the_head_lost_on_a_head_that_needs_detail(program):
    """A head that came back (GCS fault tolerance) still lists the dead job RUNNING, its driver on no ALIVE node, and
    the supervisor adopted the attempt (so it knows no head id of its start): only the head's start time shows the
    job is older than the head. Ray's state API gives that time only with detail=true (as the fake head does): the
    supervisor must ask for it, through the controller's one Ray client."""
    rows = [node("H2", "10.0.0.1", gpus=0, head=True, started=5_000), node("W1", "10.0.0.2", started=5_000),
            node("H1", "10.0.0.9", gpus=0, head=True, state="DEAD", started=100)]
    job = {"submission_id": SPEC["submission_id"], "status": "RUNNING", "driver_node_id": "H1", "start_time": 1_000,
           "message": None, "logs": "step 3: {'loss': 1.0}\n"}
    lines: list[str] = []
    with FakeRayHead(rows=rows, jobs={job["submission_id"]: job}) as head:
        client = program.rh.RayHead(head.url)
        assert program.rules.head_of(client.nodes(detail=False))["start_time_ms"] is None  # what it read before
        sup = program.Supervisor(program.sv.SupervisorSpec.of({**SPEC, "head_url": head.url}), client,
                                 out=lines.append)
        assert sup.current_head()["start_time_ms"] == 5_000
        verdict, step = sup.watch(1)
    assert verdict.kind == "retryable" and "started before the head now serving (H2)" in verdict.reason, verdict
    assert step == 3
    assert any(p.startswith("/api/v0/nodes") and "detail=true" in p for p in head.asked)


def test_the_shipped_program_runs_an_attempt_to_its_end_over_http(tmp_path):
    """supervise.py and the modules it ships with, under python3 -I -S, against the fake head over HTTP: it submits
    attempt 1 (POST /api/jobs/), follows it until the head says SUCCEEDED, and finishes SUCCEEDED (exit 0)."""
    for name, text in program_files().items():
        (tmp_path / name).write_text(text)
    with FakeRayHead(rows=[node("H", gpus=0, head=True, started=1)]) as head:
        (tmp_path / "spec.json").write_text(json.dumps({**SPEC, "head_url": head.url, "poll_seconds": 0.2,
                                                        "checkpoint_dir": str(tmp_path / "c")}))
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(tmp_path / "supervise.py"), "--spec",
                                 str(tmp_path / "spec.json")], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
        deadline = time.monotonic() + 30
        while SPEC["submission_id"] not in head.jobs and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        head.jobs[SPEC["submission_id"]].update(status="SUCCEEDED", logs="step 0: {'loss': 1.0}\n")
        out, _ = proc.communicate(timeout=30)
    events = sv.parse_events(out)
    assert proc.returncode == 0, out
    said = [e["event"] for e in events]
    assert said == ["supervisor_started", "attempt_started", "attempt_ended", "finished"], events
    assert events[1]["submission_id"] == SPEC["submission_id"] and events[-1]["status"] == "SUCCEEDED"
    assert "POST /api/jobs/" in head.asked
