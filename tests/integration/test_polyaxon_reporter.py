"""The supervisor's Polyaxon reporter (launchers/polyaxon_report.py) against the real Polyaxon API server (haupt
sandbox), without Ray: what a supervisor started again (it re-reads each attempt's log from its start) reports, and
a log line cut between two pieces of the log. The log is what the STAND-IN trainer tests/fakes/fake_metrics_train.py
prints."""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest

from tests.conftest import REPO
from tests.infra.scripts import load_script

pytestmark = [pytest.mark.polyaxon]

PROJECT = "miles-reporter"


def reporter_module():
    return load_script("launchers/polyaxon_report.py", "miles_ray_polyaxon_report")


def tracked_run_and_log(polyaxon_server, name: str, rollouts: int) -> tuple:
    """(TrackedRuns of PROJECT, the uuid of a new run ``name``, what the STAND-IN trainer prints for ``rollouts``
    rollouts with an eval every 3)."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns

    polyaxon_server.create_project(PROJECT)
    runs = TrackedRuns(PolyaxonApi(host=polyaxon_server.host), "default", PROJECT)
    uuid = runs.create(name, inputs={"command": "train.py"}, tags=["miles-ray"], meta={"miles_ray_run": name})
    log = subprocess.run([sys.executable, str(REPO / "tests" / "fakes" / "fake_metrics_train.py"), "--num-rollout",
                          str(rollouts), "--eval-interval", "3", "--eval-prompt-data", "aime", "/d"],
                         capture_output=True, text=True, check=True).stdout
    return runs, uuid, log


def test_a_supervisor_started_again_reports_nothing_twice(polyaxon_server, tmp_path):
    from miles_ray.core.metrics import parse_metrics

    runs, uuid, log = tracked_run_and_log(polyaxon_server, "rep-1", 6)
    section = {"host": polyaxon_server.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
               "work_dir": str(tmp_path / "work")}
    module = reporter_module()
    first = module.make_reporter(section)
    first.attempt_started({"event": "attempt_started", "attempt": 1, "submission_id": "rep-1"})
    cut = log.index("\n", len(log) // 2) + 5  # in the middle of a line
    first.log_chunk(1, log[:cut])
    first.upload()  # then it is gone (SIGKILL): nothing more of it, not even at its exit
    atexit.unregister(first.close)

    again = module.make_reporter(section)  # the supervisor started again: the attempt's log from its start
    again.log_chunk(1, log[:100])
    again.log_chunk(1, log[100:])
    again.finished({"event": "finished", "status": "SUCCEEDED", "reason": "the job succeeded"})

    assert runs.logs(uuid) == [line for line in log.splitlines() if line.strip()]
    want = parse_metrics(log)["metrics"]
    got = runs.metrics(uuid, ["train/loss", "eval/aime", "perf/rollout_time", "rollout/raw_reward"])
    for name, points in got.items():
        assert len(points) == want[name]["count"] and points[-1] == (want[name]["id"], want[name]["value"]), name
    run = runs.run(uuid)
    assert run["status"] == "succeeded" and run["outputs"]["train__loss"] == want["train/loss"]["value"]
    assert run["outputs"]["eval__aime"] == want["eval/aime"]["value"]


KILLED_REPORTER = """
import json, sys, time
sys.path.insert(0, {repo!r})
from tests.infra.scripts import load_script
module = load_script("launchers/polyaxon_report.py", "miles_ray_polyaxon_report")
section, log, cuts = json.loads(sys.stdin.read())
reporter = module.make_reporter(section)
reporter.attempt_started({{"event": "attempt_started", "attempt": 1, "submission_id": "rep"}})
reporter.log_chunk(1, log[:cuts[0]])
reporter.upload()  # what Polyaxon holds now, and the offsets of the reporter
reporter.log_chunk(1, log[cuts[0]:cuts[1]])  # lines it takes in before the next upload
print("fed", flush=True)
time.sleep(600)  # killed here (SIGKILL): no upload, no exit handler
"""


def stated_losses(rollouts: int) -> list[tuple[int, float]]:
    """The ``train/loss`` points the STAND-IN trainer states it prints (its docstring: one ``step`` line per rollout,
    the loss falling linearly to 0), computed here, not parsed from its log."""
    return [(rid, round(0.05 * (1 - (rid + 1) / rollouts), 6)) for rid in range(rollouts)]


@pytest.mark.parametrize("wait_for_disk", [True, False], ids=["after-its-files-took-the-lines", "right-away"])
def test_a_reporter_killed_between_two_uploads_sends_each_line_and_point_once(polyaxon_server, tmp_path,
                                                                                wait_for_disk):
    """A supervisor is SIGKILLed (a reboot, the OOM killer) after its reporter took in lines that were not uploaded
    yet; the supervisor started again re-reads the attempt's log from its start: Polyaxon holds each log line and
    each metric point exactly once. The reporter's files took those lines (its writers append them) before the
    offsets of the upload said so: a reporter that trusted its last upload's offsets logged them twice (17 of 40
    points twice in one CI-like run)."""
    import json
    import os
    import signal
    import time

    rollouts = 12
    runs, uuid, log = tracked_run_and_log(polyaxon_server, f"rep-kill-{int(wait_for_disk)}", rollouts)
    work = tmp_path / "work"
    section = {"host": polyaxon_server.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
               "work_dir": str(work), "upload_seconds": 3600}
    cuts = [log.index("\n", len(log) // 3) + 1, log.index("\n", 2 * len(log) // 3) + 7]  # the 2nd ends mid-line
    proc = subprocess.Popen([sys.executable, "-c", KILLED_REPORTER.format(repo=str(REPO))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        proc.stdin.write(json.dumps([section, log, cuts]))
        proc.stdin.close()
        said = [""]
        while said[-1] != "fed":  # (Polyaxon's upload prints its own progress)
            line = proc.stdout.readline()
            assert line, f"the reporter ended before it took in its lines: {said}"
            said.append(line.strip())
        loss_file = work / uuid / "events" / "metric" / "train__loss.plx"
        fed = sum(1 for line in log[:cuts[1]].splitlines() if "step " in line and "train/loss" in line)
        deadline = time.monotonic() + (25 if wait_for_disk else 0)
        while wait_for_disk and time.monotonic() < deadline:  # its writer has put the 2nd piece's points on disk
            if loss_file.exists() and len(loss_file.read_text().splitlines()) - 1 >= fed:
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    module = reporter_module()
    again = module.make_reporter(section)  # the supervisor started again: the attempt's log from its start
    again.log_chunk(1, log)
    again.finished({"event": "finished", "status": "SUCCEEDED", "reason": "the job succeeded"})
    atexit.unregister(again.close)

    assert runs.logs(uuid) == [line for line in log.splitlines() if line.strip()]
    got = runs.metrics(uuid, ["train/loss", "eval/aime"])
    assert got["train/loss"] == stated_losses(rollouts)
    # Miles' train.py evaluates before training (rollout 0), then after every 3rd rollout (the stand-in's loop)
    assert [step for step, _ in got["eval/aime"]] == [0] + [rid for rid in range(rollouts) if (rid + 1) % 3 == 0]


@contextlib.contextmanager
def refusing_proxy(upstream: str, refuse: Callable[[str, str], bool]) -> Iterator[SimpleNamespace]:
    """A FAULT-INJECTING proxy in front of the real Polyaxon API server (on 127.0.0.1, stopped on exit): every request
    is passed on as it is, except those ``refuse(method, path)`` picks, answered 405 as haupt's sandbox answers a
    write that comes while it serves another. ``.seen`` lists (method, path, status) of every request."""
    import http.client
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    target = urlsplit(upstream)
    seen: list[tuple[str, str, int]] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if refuse(self.command, self.path):
                seen.append((self.command, self.path, 405))
                self.send_response(405)
                self.send_header("Allow", "GET, HEAD, OPTIONS")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            seen.append((self.command, self.path, resp.status))
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(host=f"http://127.0.0.1:{server.server_address[1]}", seen=seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_statuses_and_outputs_go_through_a_405(polyaxon_server, tmp_path):
    """Polyaxon's sandbox answers 405 to a write that comes while it serves another (seen on the statuses and the
    outputs of runs under load): the reporter tries each write again, so the run shows "running" while its attempt
    runs and ends SUCCEEDED with its outputs and lineage. The 405s come from a fault-injecting proxy in front of the
    real server: it refuses the first write of each kind when the attempt starts, and again at the run's end."""
    runs, uuid, log = tracked_run_and_log(polyaxon_server, "rep-405", 3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3\n")
    phase = ["start"]
    refused: set[tuple[str, str]] = set()

    def refuse(method: str, path: str) -> bool:
        kind = ("outputs" if method == "PATCH" and path.rstrip("/").endswith(f"/runs/{uuid}") else
                "lineage" if method == "POST" and "/lineage/artifacts" in path else
                "status" if method == "POST" and path.rstrip("/").endswith("/statuses") else None)
        if kind is None or (phase[0], kind) in refused:
            return False
        refused.add((phase[0], kind))
        return True

    with refusing_proxy(polyaxon_server.host, refuse) as proxy:
        section = {"host": proxy.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
                   "work_dir": str(tmp_path / "work"), "checkpoint_dir": str(ckpt)}
        reporter = reporter_module().make_reporter(section)
        reporter.attempt_started({"event": "attempt_started", "attempt": 1, "submission_id": "rep-405"})
        started = runs.run(uuid)
        reporter.log_chunk(1, log)
        phase[0] = "end"
        reporter.finished({"event": "finished", "status": "SUCCEEDED", "reason": "the job succeeded"})
    assert refused == {("start", "status"), ("start", "outputs"), ("end", "outputs"), ("end", "lineage"),
                       ("end", "status")}, (refused, proxy.seen)
    assert started["status"] == "running" and started["outputs"]["attempts"] == 1, started
    run = runs.run(uuid)
    assert run["status"] == "succeeded", run["status"]
    assert "eval__aime" in run["outputs"] and "train__loss" in run["outputs"], run["outputs"]
    assert {a["name"] for a in runs.lineage(uuid)} >= {"checkpoints"}, proxy.seen


def test_a_diverged_loss_is_told_once_as_an_output_of_the_run(polyaxon_server, tmp_path, monkeypatch):
    """A NaN loss (the ``nan_loss`` finding of ``status RUN``) is told to the Polyaxon run of a tracked run: its
    output ``nan_loss`` says which loss, at which rollout; told once, at an upload, and the run is not stopped (the
    reporter's logs and metrics go on as before)."""
    monkeypatch.setenv("MILESRAY_TEST_FAKE_NAN_LOSS_FROM", "4")  # the STAND-IN's loss is nan from rollout 4
    runs, uuid, log = tracked_run_and_log(polyaxon_server, "rep-nan", 8)
    section = {"host": polyaxon_server.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
               "work_dir": str(tmp_path / "work"), "upload_seconds": 0.001}
    reporter = reporter_module().make_reporter(section)
    atexit.unregister(reporter.close)
    told: list[str] = []
    send = reporter.rc.log_outputs

    def log_outputs(**outputs):  # the real client's call, counted
        if "nan_loss" in outputs:
            told.append(outputs["nan_loss"])
        return send(**outputs)

    reporter.rc.log_outputs = log_outputs
    reporter.attempt_started({"event": "attempt_started", "attempt": 1, "submission_id": "rep-nan"})
    lines = log.splitlines(keepends=True)
    for i in range(0, len(lines), 3):  # pieces of the log, an upload after each
        reporter.log_chunk(1, "".join(lines[i:i + 3]))
    assert runs.run(uuid)["outputs"]["nan_loss"].startswith("train/loss is nan at rollout 4: the loss diverged")
    reporter.finished({"event": "finished", "status": "SUCCEEDED", "reason": "the job succeeded"})
    assert len(told) == 1, told
    run = runs.run(uuid)
    assert run["status"] == "succeeded" and run["outputs"]["nan_loss"] == told[0]
    assert runs.logs(uuid) == [line for line in log.splitlines() if line.strip()]  # every line, once


def test_the_lineage_lists_the_checkpoints_the_retention_keeps(polyaxon_server, tmp_path):
    """Issue 37: the shipped supervisor (its real pruning, ``--keep-checkpoints 1 --keep-best eval/aime``) with its
    reporter on a run of the real Polyaxon server: each complete checkpoint is listed in the run's lineage (kind
    model, named as its dir, its bytes as on disk) once an upload sees it; one the retention deletes is deleted from
    the lineage; one being written is not listed. At the end the lineage lists exactly the checkpoints on disk."""
    import importlib.util

    from miles_ray.controller.program import program_files

    runs, uuid, _ = tracked_run_and_log(polyaxon_server, "rep-kept", 3)
    program_dir = tmp_path / "program"
    program_dir.mkdir()
    for name, text in program_files().items():
        (program_dir / name).write_text(text)
    spec = importlib.util.spec_from_file_location("shipped_supervise_lineage", program_dir / "supervise.py")
    program = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    try:
        spec.loader.exec_module(program)
        root = tmp_path / "ckpt"
        section = {"host": polyaxon_server.host, "owner": "default", "project": PROJECT, "run_uuid": uuid,
                   "work_dir": str(tmp_path / "work"), "upload_seconds": 0.001}
        sup_spec = program.sv.SupervisorSpec.of({
            "run": "rep-kept", "head_url": "http://127.0.0.1:9", "submission_id": "rep-kept", "max_restarts": 0,
            "first_job": {"entrypoint": "python3 train.py"}, "checkpoint_dir": str(root), "keep_checkpoints": 1,
            "keep_best": "eval/aime", "polyaxon": section})
        reporter = program.load_reporter(sup_spec)
        assert reporter is not None
        atexit.unregister(reporter.close)
        lines: list[str] = []
        sup = program.Supervisor(sup_spec, api=None, reporter=reporter, out=lines.append)

        def save(it: int, size: int, tracker: bool = True) -> None:
            (root / f"iter_{it:07d}").mkdir(parents=True)
            (root / f"iter_{it:07d}" / "model.pt").write_bytes(b"x" * size)
            if tracker:
                (root / "latest_checkpointed_iteration.txt").write_text(str(it))

        def listed() -> dict[str, dict]:
            return {a["name"]: a for a in runs.lineage(uuid) if a["name"].startswith("iter_")}

        sup.scores.feed(1, "step 2: {}\neval 2: {'eval/aime': 0.9}\nstep 5: {}\neval 5: {'eval/aime': 0.1}\n")
        save(2, 20)
        save(5, 50)
        sup.prune(1, live=True)  # the newest (5) and the best (2): nothing deleted
        reporter.log_chunk(1, "step 5: {}\n")  # an upload: it sees the new checkpoints
        got = listed()
        assert sorted(got) == ["iter_0000002", "iter_0000005"], got
        assert got["iter_0000005"]["kind"] == "model" and got["iter_0000005"]["path"] == str(root / "iter_0000005")
        assert got["iter_0000005"]["summary"] == {"iteration": 5, "bytes": 50, "checkpoint_dir": str(root)}
        save(8, 80)
        save(11, 10, tracker=False)  # being written
        sup.prune(1, live=True)  # 5 is beyond the newest 1 and not the best: deleted, and so from the lineage
        deleted = [e for e in program.sv.parse_events("\n".join(lines)) if e["event"] == "checkpoint_deleted"]
        assert [e["iteration"] for e in deleted] == [5] and not (root / "iter_0000005").exists()
        assert sorted(listed()) == ["iter_0000002", "iter_0000008"]
        sup.emit("finished", status="SUCCEEDED", reason="the job succeeded", at="T", attempts=1)
    finally:
        for name in set(sys.modules) - before:
            sys.modules.pop(name, None)
        sys.path[:] = [p for p in sys.path if p != str(program_dir)]
    on_disk = sorted(p.name for p in root.iterdir() if p.name.startswith("iter_") and p.name != "iter_0000011")
    assert sorted(listed()) == on_disk == ["iter_0000002", "iter_0000008"]
    assert {a["name"] for a in runs.lineage(uuid)} >= {"checkpoints"} and runs.run(uuid)["status"] == "succeeded"
