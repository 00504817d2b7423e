"""Issue 37, logs are outputs: the saved copy of a supervised run keeps every attempt's driver log and job info (and its
supervisor's events), and 'logs RUN' once the cluster is gone prints every attempt whole -- or names, in one error line
and exit 1, an attempt whose copy could not be saved. Over the saving and reading functions
(miles_ray/services/saved_runs.py, the supervised run backend) with a FAKE head: a Jobs API stand-in in this process
(the real embedded cluster runs the same in tests/integration/test_saved_logs.py)."""

from __future__ import annotations

import contextlib
import json

import pytest

from miles_ray.adapters import ray_jobs, state
from miles_ray.core.errors import NotFound, Unreachable
from miles_ray.core.supervision import event_line
from miles_ray.services import saved_runs
from miles_ray.services.runs import ray_job, supervised

RUN, SID, ADDRESS = "two", "miles-ray-c-two", "local://c"
LOGS = {SID: "step 0: {'train/loss': 0.1}\n" * 3 + "fault: SIGKILL\n",
        f"{SID}-a2": "loaded checkpoint at iteration 0\n" + "step 1: {'train/loss': 0.05}\n" * 4 + "done\n"}
STATUS = {SID: "FAILED", f"{SID}-a2": "SUCCEEDED"}


class FakeHead:
    """The Jobs API of a head that has the run's two attempts (``jobs``), until it goes ``down``."""

    def __init__(self) -> None:
        self.jobs = dict(STATUS)
        self.down = False

    def _up(self) -> None:
        if self.down:
            raise Unreachable("connection refused (the cluster is down)")

    def list_jobs(self, url: str) -> list[dict]:
        self._up()
        return [{"job_id": sid, "status": st, "end_time": 1, "entrypoint": "python3 train.py"}
                for sid, st in self.jobs.items()]

    def status(self, url: str, sid: str) -> dict:
        self._up()
        if sid not in self.jobs:
            raise NotFound(f"no job {sid}")
        return {"job_id": sid, "status": self.jobs[sid], "end_time": 1, "runtime_env": {"env_vars": {"T": "secret"}}}

    def logs(self, url: str, sid: str) -> str:
        self._up()
        if sid not in self.jobs:
            raise NotFound(f"no job {sid}")
        return LOGS[sid]


@pytest.fixture
def head(monkeypatch, tmp_path, clean_env):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    fake = FakeHead()

    @contextlib.contextmanager
    def open_head(address, **_):
        fake._up()
        yield "http://head"

    for module in (saved_runs, ray_job):
        monkeypatch.setattr(module, "open_head", open_head)
    for name in ("list_jobs", "status", "logs"):
        monkeypatch.setattr(ray_jobs, name, getattr(fake, name))
    sup = tmp_path / "sup"
    sup.mkdir()
    events = [event_line("supervisor_started", run=RUN),
              event_line("attempt_started", attempt=1, submission_id=SID, started="t1"),
              event_line("attempt_ended", attempt=1, submission_id=SID, status="FAILED", ended="e1", reason="killed",
                         last_step=0, retry=True, why="w"),
              event_line("attempt_started", attempt=2, submission_id=f"{SID}-a2", started="t2", resumed_from="/ck",
                         resumed_iteration=0),
              event_line("attempt_ended", attempt=2, submission_id=f"{SID}-a2", status="SUCCEEDED", ended="e2",
                         reason="ok", last_step=1, retry=False, why="the run succeeded"),
              event_line("finished", status="SUCCEEDED", reason="the job succeeded", attempts=2)]
    (sup / "events.log").write_text("\n".join(events) + "\n")
    record = {"run": RUN, "submission_id": SID, "address": ADDRESS, "output_dir": "/out", "recipe": "Qwen3-4B",
              "mode": "direct", "created": "2026-01-01T00:00:00+00:00",
              "supervisor": {"kind": "local", "max_restarts": 3, "where": {"dir": str(sup)}},
              "attempts": [{"attempt": 1, "submission_id": SID}, {"attempt": 2, "submission_id": f"{SID}-a2"}]}
    state.save_record(record)
    return fake


WHOLE = (f"== attempt 1 ({SID}) ==\n" + LOGS[SID]
         + f"== attempt 2 ({SID}-a2), resumed from /ck iter 0, from rollout 1 ==\n" + LOGS[f"{SID}-a2"])


def test_down_saves_every_attempt_and_logs_prints_them_whole_after_it(head, cli):
    got = saved_runs.save_cluster_runs(saved_runs.records_on([ADDRESS]), ADDRESS)
    assert (got.saved, got.not_saved) == ([RUN], {})
    head.down = True
    code, out, err = cli("logs", RUN)
    assert (code, out) == (0, WHOLE), err
    assert err.count("reading the saved copy") == 2
    code, out, err = cli("logs", RUN, "-o", "json")
    assert code == 0 and json.loads(out)["logs"] == WHOLE, err
    for n, sid in ((1, SID), (2, f"{SID}-a2")):  # runs/RUN.saved/ and runs/RUN.saved/attempt-2/
        copy = state.load_run_copy(RUN, n)
        assert copy["dir"] == str(state.saved_dir(RUN) / ("attempt-2" if n == 2 else ""))
        assert copy["logs"] == LOGS[sid] and copy["job"]["submission_id"] == sid
        assert copy["job"]["status"] == STATUS[sid] and "runtime_env" not in copy["job"] and copy["reason"] == "down"


def test_an_ended_attempt_is_saved_when_its_run_is_read_and_not_read_again(head, cli):
    """No 'down': 'status RUN' of the finished run saves both attempts (and the supervisor's events) once; a second
    'status' reads nothing more from the head; the cluster then vanishes without 'down': 'logs' is whole."""
    code, out, err = cli("status", RUN, "-o", "json")
    assert code == 0 and json.loads(out)["status"] == "SUCCEEDED", err
    assert [state.load_run_copy(RUN, n)["reason"] for n in (1, 2)] == ["the job ended (FAILED)",
                                                                        "the job ended (SUCCEEDED)"]
    events = json.loads((state.saved_dir(RUN) / saved_runs.SAVED_EVENTS).read_text())
    assert [e["event"] for e in events][-1] == "finished"
    files = [state.saved_attempt_dir(RUN, n) / f for n in (1, 2) for f in ("job.json", "driver.log")]
    files.append(state.saved_dir(RUN) / saved_runs.SAVED_EVENTS)
    written = [f.stat().st_mtime_ns for f in files]
    cli("status", RUN)
    cli("logs", RUN)
    assert [f.stat().st_mtime_ns for f in files] == written  # an ended attempt's copy is final: not written again
    head.down = True
    code, out, err = cli("logs", RUN)
    assert (code, out) == (0, WHOLE), err


def test_the_supervisor_events_kept_with_the_run_stand_in_for_a_lost_supervisor(head, cli, tmp_path):
    supervised.save_supervisor_events([state.load_record(RUN)])
    saved_runs.save_cluster_runs([state.load_record(RUN)], ADDRESS)
    (tmp_path / "sup" / "events.log").unlink()  # the supervisor's own files are gone (another machine, a cleanup)
    head.down = True
    code, out, err = cli("logs", RUN)
    assert (code, out) == (0, WHOLE), err
    code, out, _ = cli("status", RUN, "-o", "json")
    assert code == 0 and [a["status"] for a in json.loads(out)["attempts"]] == ["FAILED", "SUCCEEDED"]


def test_an_attempt_that_could_not_be_saved_is_named_in_one_line_and_logs_exits_1(head, cli):
    del head.jobs[f"{SID}-a2"]  # the head lost attempt 2's job (its driver's logs went with it)
    got = saved_runs.save_cluster_runs([state.load_record(RUN)], ADDRESS)
    assert got.saved == [] and list(got.not_saved) == [RUN]
    assert got.not_saved[RUN] == f"attempt 2: the head has no job {SID}-a2"
    head.down = True
    code, out, err = cli("logs", RUN)
    assert code == 1 and out == f"== attempt 1 ({SID}) ==\n" + LOGS[SID]
    [line] = err.splitlines()[1:]  # after the one "reading the saved copy" line of attempt 1
    assert line.startswith("error: ") and f"attempt 2 ({SID}-a2)" in line and "1 of 2 attempts" in line


def test_a_head_that_does_not_answer_at_down_names_the_attempts_left_unsaved(head):
    saved_runs.save_from_head(state.load_record(RUN), "http://head", "the job ended (FAILED)")  # attempt 1
    head.down = True
    got = saved_runs.save_cluster_runs([state.load_record(RUN)], ADDRESS)
    assert got.saved == [] and got.not_saved[RUN].startswith("attempt 2: the head did not answer")
