"""Run records of every kind this miles-ray wrote are read back: a Polyaxon-tracked run can be resumed from, and a
state dir moved elsewhere (a new machine, a backup restored) gives the same ``status RUN`` verdict and ``logs RUN``
output. The records are made as today's code writes them (its own prepare, track and supervisor steps where they
run without a cluster; the supervisor's events in the format launchers/supervise.py prints). No cluster: the head
is a closed port."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from miles_ray.adapters import state
from miles_ray.adapters.local_ray.supervisor import LocalSupervisor
from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns
from miles_ray.core import supervision as sv
from miles_ray.core.config import load_config
from miles_ray.core.runs import RunRecord
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
from miles_ray.services.runs import polyaxon_tracked

CLOSED = "http://127.0.0.1:9"  # a closed port: nothing answers there
CREATED = "2026-08-22T00:00:00+00:00"
RECIPE = "Qwen3-4B"  # direct mode saves checkpoints (--save): a supervised run by default


def _cfg():
    return load_config({"name": "rc", "namespace": "ml", "recipe": RECIPE, "nodes": 1}, environ={})


def _prepared(run: str):
    """The job submit prepares for ``run`` on a head reached at an address, with a local supervisor available."""
    cfg = _cfg()
    valid = validate_request(cfg, SubmitRequest(run=run))
    target = SubmitTarget("address", CLOSED, supervisors=frozenset({"local"}))
    return prepare_submit(cfg, valid, target, created=CREATED, launchers_dir="/unused")


def _as_started(job, where: dict) -> dict:
    """The record as SupervisedRun.submit writes it once the supervisor started (``where``: the handle's)."""
    record = {**job.record, "attempts": []}
    record["supervisor"] = {**record["supervisor"], "where": where, "started": CREATED}
    return record


@pytest.fixture
def state_dir(clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    return clean_env / "state"


# -- 1. resuming from a Polyaxon-tracked run ------------------------------------------------------------------

def _tracked_record(monkeypatch, run: str) -> dict:
    """A tracked run's record as ``polyaxon_tracked.track`` makes it (its Polyaxon run created: a stand-in for the
    API call) and the supervised submit then records it."""
    monkeypatch.setattr(TrackedRuns, "create", lambda self, name, **kw: "0123456789abcdef0123456789abcdef")
    home = polyaxon_tracked.PolyaxonHome(host="http://polyaxon.example:8000", owner="acme", project="miles")
    job = polyaxon_tracked.track(_prepared(run), home)
    assert job.record["polyaxon_tracked"] is True  # the shape under test: today's tracked records carry it
    return _as_started(job, {"dir": str(state.state_dir() / "supervisors" / run), "pid": 1, "start_ticks": 1})


def test_submit_resumes_from_a_polyaxon_tracked_run(cli, state_dir, monkeypatch):
    tracked = _tracked_record(monkeypatch, "tracked-a")
    state.create_record(tracked)
    code, out, err = cli("submit", "--address", CLOSED, "--recipe", RECIPE, "--nodes", "1", "--run", "tracked-b",
                         "--resume-from", "tracked-a", "--dry-run", "client", "-o", "json")
    assert code == 0, err
    view = json.loads(out)
    assert view["resumed_from"] == "tracked-a" and view["output_dir"] == tracked["output_dir"]
    assert view["record"]["load_dir"] == tracked["checkpoint_dir"]
    assert f"--load {tracked['checkpoint_dir']}" in view["entrypoint"]
    # the prepared record of a new run leaves the creation-time fields out, as before
    assert "polyaxon_tracked" not in view["record"] and "attempts" not in view["record"]


def test_every_kind_of_record_this_tool_writes_validates(state_dir, monkeypatch):
    """Records as written: a tracked run, a supervised local run, a Ray job lost with its head, a launcher job."""
    from miles_ray.core.runs import head_identity, mark_lost, new_attempt

    supervised = _as_started(_prepared("sup"), {"dir": "supervisors/sup", "pid": 1, "start_ticks": 1})
    supervised["attempts"] = sv.fold_attempts(sv.parse_events("\n".join(_events(supervised["submission_id"]))))
    plain = {k: v for k, v in _prepared("plain").record.items() if k != "supervisor"}  # --max-restarts 0
    head = head_identity("a" * 56, {"pod": "ml/h", "pod_uid": "u1"})
    plain = {**plain, "head": head, "attempts": new_attempt(None, plain["submission_id"], CREATED, head, None)}
    lost = mark_lost(plain, CREATED, "head pod gone", None)
    launcher = {**plain, "mode": "launcher", "polyaxon_owner": "acme", "polyaxon_project": "miles",
                "polyaxon_host": "http://polyaxon.example:8000", "polyaxon_run_uuid": "u"}
    for rec in (_tracked_record(monkeypatch, "tr"), supervised, plain, lost, launcher):
        assert RunRecord.model_validate(rec).run == rec["run"]


# -- 2. a state dir moved elsewhere --------------------------------------------------------------------------

def _events(sid: str, ckpt: str = "/mnt/miles/runs/sup/checkpoints") -> list[str]:
    """A run that failed once and SUCCEEDED in attempt 2, as launchers/supervise.py prints its events."""
    return [
        "supervise.py started",  # other lines are skipped
        sv.event_line("supervisor_started", run="sup", pid=4242, at="2026-08-22T00:00:01+00:00", max_restarts=3),
        sv.event_line("attempt_started", attempt=1, submission_id=sid, started="2026-08-22T00:00:02+00:00",
                      adopted=False, resumed_from=None, resumed_iteration=None),
        sv.event_line("attempt_ended", attempt=1, submission_id=sid, status="FAILED",
                      ended="2026-08-22T00:05:00+00:00", reason="a Ray node was lost (node died)", last_step=7,
                      retry=True, why="a Ray node was lost; progress to step 7: restart 1 of 3"),
        sv.event_line("waiting_for_workers", have=0, want=1, deadline="2026-08-22T00:15:00+00:00"),
        sv.event_line("attempt_started", attempt=2, submission_id=f"{sid}-a2", started="2026-08-22T00:06:00+00:00",
                      adopted=False, resumed_from=ckpt, resumed_iteration=6),
        sv.event_line("attempt_ended", attempt=2, submission_id=f"{sid}-a2", status="SUCCEEDED",
                      ended="2026-08-22T00:09:00+00:00", reason="the job succeeded", last_step=11, retry=False,
                      why="the run succeeded"),
        sv.event_line("finished", status="SUCCEEDED", reason="the job succeeded", at="2026-08-22T00:09:01+00:00",
                      attempts=2),
    ]


def _supervised_run_as_written_today(run: str = "sup") -> dict:
    """A supervised local run that SUCCEEDED in 2 attempts, as today's code leaves it in the state dir: its record
    naming its supervisor's dir by absolute path (LocalSupervisor.start's ``where``), the supervisor's files in that
    dir (events.log: its stdout; spec.json naming its token copy there; process.json of a process long gone), the
    record's attempts as ``status`` synced them, and the saved copy of the last attempt's job."""
    job = _prepared(run)
    sup_dir = state.state_dir() / "supervisors" / run
    sup_dir.mkdir(parents=True)
    record = _as_started(job, {"dir": str(sup_dir), "pid": os.getpid(), "start_ticks": 0})  # not this process
    events = _events(record["submission_id"], job.supervision["checkpoint_dir"])
    (sup_dir / "events.log").write_text("\n".join(events) + "\n")
    (sup_dir / "ray-token").write_text("t0ken\n")
    state.atomic_write_json(sup_dir / "spec.json", job.supervisor_spec(CLOSED, str(sup_dir / "ray-token")))
    state.atomic_write_json(sup_dir / "process.json", {"pid": os.getpid(), "start_ticks": 0})
    record["attempts"] = sv.fold_attempts(sv.parse_events("\n".join(events)))
    state.create_record(record)
    sid2 = f"{record['submission_id']}-a2"
    state.save_run_copy(run, {"job_id": sid2, "submission_id": sid2, "status": "SUCCEEDED", "end_time": 1},
                        "loaded checkpoint at iteration 6\nstep 11: {'train/loss': 0.5}\n", "the job ended (SUCCEEDED)",
                        "2026-08-22T00:09:02+00:00")
    return record


def test_a_moved_state_dir_gives_the_same_status_and_logs(cli, state_dir, monkeypatch, tmp_path):
    _supervised_run_as_written_today()
    code, before, err = cli("status", "sup", "-o", "json")
    assert code == 0, err
    status = json.loads(before)
    assert status["status"] == "SUCCEEDED" and [a["status"] for a in status["attempts"]] == ["FAILED", "SUCCEEDED"]
    logs_code, logs_before, err = cli("logs", "sup")
    sid = status["attempts"][0]["submission_id"]
    for said in (f"attempt 1 ({sid})", f"attempt 2 ({sid}-a2)"):  # each attempt: its logs, or why they cannot be read
        assert said in logs_before + err

    moved = tmp_path / "restored" / "state-elsewhere"
    shutil.move(str(state_dir), str(moved))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(moved))
    code, after, err = cli("status", "sup", "-o", "json")
    assert code == 0, err
    assert json.loads(after) == status
    code, logs_after, err = cli("logs", "sup")
    assert (code, logs_after) == (logs_code, logs_before)
    code, out, err = cli("runs", "--no-live", "-o", "json")
    assert code == 0 and [len(r["attempts"]) for r in json.loads(out)] == [2]


def test_a_moved_supervisor_is_started_again_with_its_files_where_they_are_now(state_dir, monkeypatch, tmp_path):
    record = _supervised_run_as_written_today()
    moved = tmp_path / "state-elsewhere"
    shutil.move(str(state_dir), str(moved))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(moved))
    handle = LocalSupervisor("sup", state.load_record("sup")["supervisor"]["where"])
    assert handle.dir == moved / "supervisors" / "sup" and handle.alive() is False
    started = []
    monkeypatch.setattr(LocalSupervisor, "start", lambda self, spec: started.append(spec) or {})
    assert handle.restart() is True
    assert started[0]["token_file"] == str(moved / "supervisors" / "sup" / "ray-token")
    assert started[0]["submission_id"] == record["submission_id"]


def test_a_supervisor_dir_is_kept_relative_to_the_state_dir(state_dir):
    inside = state.state_dir() / "supervisors" / "r1"
    assert state.kept_path(inside) == os.path.join("supervisors", "r1")
    assert state.kept_path("/elsewhere/x") == "/elsewhere/x"  # outside the state dir: as it is
    assert LocalSupervisor("r1", {"dir": "supervisors/r1"}).dir == inside
    # an absolute path of an older record that still exists is used as written
    other = state_dir.parent / "old" / "supervisors" / "r1"
    other.mkdir(parents=True)
    assert LocalSupervisor("r1", {"dir": str(other)}).dir == other
