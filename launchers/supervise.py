#!/usr/bin/env python3
"""THE run supervisor: carries one run through its failures, on any cluster (a detached process beside the
embedded cluster, a Kubernetes Job in the cluster, the Polyaxon run of a Miles run).

``python3 supervise.py --spec FILE``: FILE is the JSON spec (``miles_ray.core.supervision.SupervisorSpec``). The
program talks to the Ray head's Jobs API and state API over plain HTTP (``ray_http.py``, the run controller's one
Ray client), with ``Authorization: Bearer <token>`` from the spec's token file. It submits the run's attempts one
at a time (attempt 1 under the run's submission id, attempt N under ``<it>-a<N>``), watches each, and when one
fails for a reason worth retrying (the controller's ``rules.classify`` / ``rules.decide``) waits (bounded) until
the GPU workers are ALIVE in Ray again and submits the next attempt, which loads the run's last complete
checkpoint.

It says what it does on stdout, one event a line (``MILES_RAY_SUPERVISOR {json}``): ``supervisor_started``,
``attempt_started`` (attempt, submission_id, started, resumed_from, resumed_iteration: the checkpoint it loads,
Miles' numbering -- it starts at rollout resumed_iteration + 1 --, adopted),
``waiting_for_workers`` (have, want, deadline), ``attempt_ended`` (attempt, submission_id, status, ended, reason,
last_step, retry, why), ``finished`` (status SUCCEEDED | FAILED | STOPPED, reason, attempts), and with a
retention in the spec (``keep_checkpoints``/``keep_best``: ``supervision.retention_plan``, checked after each new
complete checkpoint and when an attempt ends) ``checkpoint_deleted`` (iteration, path, bytes, why, attempt, at). Exit 0 once the run's
end is decided (SUCCEEDED, FAILED or STOPPED: the ``finished`` event says which), 1 when the supervisor itself could
not work (the head did not answer it, or refused it: its pod is then restarted), 2 for a spec it cannot use.

It survives its own restart: on start it lists the run's jobs on the head and ADOPTS an attempt that is PENDING
or RUNNING instead of submitting; before every submission it lists them again (never two drivers of one run). A
STOPPED attempt is never followed by another (that is how ``miles-ray stop RUN`` wins any race).

Standard library only (Ray's images and Polyaxon's sidecar have python3, nothing of ours): it imports the run
controller's modules (miles_ray/controller's ``ray_http.py``, ``rules.py``, ``checkpoint_dirs.py``) and
miles_ray/core's ``supervision.py`` and ``metrics.py``, shipped beside it by
``miles_ray.controller.program``, from its own directory. An optional reporter (``polyaxon_report.py``
beside it) is loaded only when the spec has a ``polyaxon`` section: see :func:`load_reporter`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (python3 -I leaves the script's dir out)
import checkpoint_dirs as cd  # noqa: E402 - shipped beside this file (miles_ray/controller/checkpoint_dirs.py)
import ray_http as rh  # noqa: E402 - (miles_ray/controller/ray_http.py)
import rules  # noqa: E402 - (miles_ray/controller/rules.py)
import supervision as sv  # noqa: E402 - (miles_ray/core/supervision.py)

LOG_READ_SECONDS = 10.0  # a running attempt's logs are read (whole: the Jobs API has no offset) this often at most
# Kubernetes' terminationMessagePath (the default): what a container writes there is its pod's
# status.containerStatuses[].state.terminated.message (kubectl describe pod: "Message"), at most 4096 bytes.
# Outside a container the file does not exist and nothing is written.
TERMINATION_LOG = "/dev/termination-log"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def say_on_termination(line: str) -> None:
    """The run's end as the supervisor's pod shows it, when it runs in a Kubernetes container."""
    if not os.path.exists(TERMINATION_LOG):
        return
    try:
        with open(TERMINATION_LOG, "w", encoding="utf-8") as fh:
            fh.write(line.encode("utf-8")[:4000].decode("utf-8", "ignore"))
    except OSError:
        pass  # a read-only or odd mount: the events on stdout say the same


def load_reporter(spec: sv.SupervisorSpec) -> Any:
    """THE HOOK POINT for reporting elsewhere: with a ``polyaxon`` section in the spec, the object made by
    ``polyaxon_report.make_reporter(spec)`` (a module shipped beside this file) gets ``attempt_started(event)``,
    ``log_chunk(attempt, text)``, ``attempt_ended(event)``, ``checkpoint_deleted(event)`` and ``finished(event)``. None without that section. A
    reporter that fails is said on stderr and never stops the supervisor."""
    if not spec.polyaxon:
        return None
    try:
        import polyaxon_report  # type: ignore[import-not-found]

        return polyaxon_report.make_reporter(spec)
    except Exception as e:  # noqa: BLE001 - reporting is best effort
        print(f"supervise.py: no Polyaxon reporter ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


class Supervisor:
    def __init__(self, spec: sv.SupervisorSpec, api: rh.RayHead, reporter: Any = None,
                 out: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.api = api
        self.reporter = reporter
        self.out = out or (lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush()))
        self.steps: dict[int, int | None] = {}  # attempt -> last training step seen in its logs
        self.log_len: dict[int, int] = {}
        self.logs_seen: dict[int, str] = {}  # attempt -> the tail of its logs (for the classifier)
        self.attempt_head: dict[int, str | None] = {}
        self.attempts_started = 0
        self.resumed_iteration: dict[int, int | None] = {}  # attempt -> latest_checkpointed_iteration then
        # retention (supervision.retention_plan): the metrics logged for each checkpoint, the partial checkpoints a
        # dead attempt left (iteration -> their files' signature then), the tracker the last pruning was for
        self.retention = sv.Retention.of(spec.keep_checkpoints, spec.keep_best)
        self.scores = sv.CheckpointScores()
        self.dead: dict[int, Any] = {}
        self.pruned_for: int | None = None
        self.undeletable: set[int] = set()

    # -- events -----------------------------------------------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"event": kind, **fields}
        self.out(sv.event_line(kind, **fields))
        hook = {"attempt_started": "attempt_started", "attempt_ended": "attempt_ended",
                "checkpoint_deleted": "checkpoint_deleted", "finished": "finished"}.get(kind)
        self._report(hook, event)
        return event

    def _report(self, method: str | None, *args: Any) -> None:
        if self.reporter is None or method is None or not hasattr(self.reporter, method):
            return
        try:
            getattr(self.reporter, method)(*args)
        except Exception as e:  # noqa: BLE001 - reporting is best effort
            print(f"supervise.py: reporter.{method} failed ({type(e).__name__}: {e})", file=sys.stderr, flush=True)

    def sleep(self) -> None:
        time.sleep(self.spec.poll_seconds)

    # -- reading the head, patiently --------------------------------------------------------------------------
    def patiently(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, retried while the head does not answer, up to ``workers_timeout`` seconds (then None)."""
        deadline = time.monotonic() + max(self.spec.workers_timeout, 30.0)
        while True:
            try:
                return fn()
            except rh.NO_ANSWER as e:
                if time.monotonic() > deadline:
                    print(f"supervise.py: the head did not answer {what} ({e})", file=sys.stderr, flush=True)
                    return None
                self.sleep()

    def run_jobs(self) -> dict[int, dict[str, Any]]:
        """The run's jobs on the head, by attempt."""
        out = {}
        for job in self.api.jobs():
            n = rules.attempt_of(self.spec.submission_id, job.get("submission_id") or "")
            if n is not None:
                out[n] = job
        return out

    def current_head(self) -> dict[str, Any]:
        return rules.head_of(self.api.nodes(detail=True))  # (detail: the head's start time, for the head-loss rule)

    def latest_iteration(self) -> int | None:
        return rules.latest_iteration(self.spec.checkpoint_dir)

    def checkpoint_progress(self, n: int) -> int | None:
        """The rollout of the newest complete checkpoint (Miles' numbering: iteration N is saved once rollout N is
        trained, 0 included), when it is newer than what attempt ``n`` started from: the attempt's progress when its
        logs could not be read (lost with the head or node its driver ran on)."""
        step = rules.checkpoint_step(self.latest_iteration(), self.resumed_iteration.get(n))
        if step is not None:
            self.steps[n] = step
        return step

    def read_logs(self, n: int, sid: str) -> None:
        try:
            text = self.api.logs(sid)
        except rh.NO_ANSWER:
            return
        seen = self.log_len.get(n, 0)
        if len(text) > seen:
            chunk = text[seen:]
            self.log_len[n] = len(text)
            step = sv.last_step(chunk)
            if step is not None:
                self.steps[n] = step
            self.scores.feed(n, chunk)
            self.logs_seen[n] = (self.logs_seen.get(n, "") + chunk)[-20000:]
            self._report("log_chunk", n, chunk)

    # -- the life of a run ------------------------------------------------------------------------------------
    def main(self) -> int:
        spec = self.spec
        self.emit("supervisor_started", run=spec.run, pid=os.getpid(), at=now_iso(), max_restarts=spec.max_restarts)
        jobs = self.patiently("the run's jobs", self.run_jobs)
        if jobs is None:
            return self.finish("FAILED", f"the Ray head at {spec.head_url} did not answer", broken=True)
        if jobs:
            n = max(jobs)
            for earlier in sorted(jobs):  # what earlier attempts trained (the no-progress rule compares)
                if earlier < n:
                    self.read_logs(earlier, jobs[earlier]["submission_id"])
            if any(j.get("status") == "STOPPED" for j in jobs.values()):
                return self.finish("STOPPED", f"attempt {min(k for k, j in jobs.items() if j.get('status') == 'STOPPED')}"
                                              " was stopped: a stopped run is never started again")
            job = jobs[n]
            head = self.patiently("its nodes", self.current_head) or {"alive": set(), "node_id": None}
            if job.get("status") in sv.LIVE and not rules.lost_with_head(job, head, None):
                self.attempt_head[n] = head.get("node_id")
                self.started(n, job["submission_id"], adopted=True,
                             started=_iso_ms(job.get("start_time")) or now_iso())
            else:
                self.attempt_head[n] = None
                self.attempts_started = n
        else:
            n = 1
            code = self.submit(1)
            if code is not None:
                return code
        while True:
            verdict, step = self.watch(n)
            if step is None and verdict.kind == "retryable":
                step = self.checkpoint_progress(n)  # its logs may have gone with its head or node
            self.prune(n, live=False)
            previous = self.steps.get(n - 1) if n > 1 else None
            decision = rules.decide(n, verdict, step, previous, spec.max_restarts)
            status = {"succeeded": "SUCCEEDED", "stopped": "STOPPED"}.get(verdict.kind, "FAILED")
            self.emit("attempt_ended", attempt=n, submission_id=rules.attempt_submission_id(spec.submission_id, n),
                      status=status, ended=now_iso(), reason=verdict.reason, last_step=step,
                      retry=decision.retry, why=decision.why)
            if not decision.retry:
                reason = verdict.reason if status != "FAILED" else f"attempt {n}: {verdict.reason}; not retried: " \
                                                                     f"{decision.why}"
                return self.finish(status, reason)
            if not self.wait_for_workers(verdict):
                return self.finish("FAILED", f"the GPU workers did not come back within {spec.workers_timeout:.0f}s "
                                             f"(want {spec.gpu_workers}) after attempt {n} failed: {verdict.reason}")
            n += 1
            code = self.submit(n)
            if code is not None:
                return code
            n = self.attempts_started

    def finish(self, status: str, reason: str, broken: bool = False) -> int:
        """The ``finished`` event, and the program's exit code: 0 once the run's end is decided, whatever it is (a
        container restarted in place would only say it again, and a restart keeps one earlier log: the first
        attempts' events would be lost); 1 when the supervisor itself could not work (``broken``: the head did not
        answer it or refused it), so that its pod is restarted and tries again."""
        self.emit("finished", status=status, reason=reason, at=now_iso(), attempts=self.attempts_started)
        say_on_termination(f"run {self.spec.run}: {status} after {self.attempts_started} attempt(s): {reason}")
        return 1 if broken else 0

    def started(self, n: int, sid: str, *, adopted: bool, started: str) -> None:
        self.attempts_started = n
        resumed = self.spec.checkpoint_dir if n > 1 else None
        self.emit("attempt_started", attempt=n, submission_id=sid, started=started, adopted=adopted,
                  resumed_from=resumed, resumed_iteration=self.resumed_iteration.get(n))

    def submit(self, n: int) -> int | None:
        """Submit attempt ``n`` -- after confirming no attempt of the run is PENDING or RUNNING (then it is adopted
        instead) and none was STOPPED (then the run ends STOPPED). None: an attempt is being watched; an exit code:
        the run ended."""
        spec = self.spec
        jobs = self.patiently("the run's jobs", self.run_jobs)
        if jobs is None:
            return self.finish("FAILED", f"the Ray head at {spec.head_url} did not answer before attempt {n}",
                               broken=True)
        stopped = sorted(k for k, j in jobs.items() if j.get("status") == "STOPPED")
        if stopped:
            return self.finish("STOPPED", f"attempt {stopped[0]} was stopped: a stopped run is never started again")
        head = self.patiently("its nodes", self.current_head) or {"alive": set(), "node_id": None}
        live = sorted(k for k, j in jobs.items() if j.get("status") in sv.LIVE
                      and not rules.lost_with_head(j, head, self.attempt_head.get(k)))
        if live:  # never two drivers: watch the one that runs
            k = live[-1]
            self.attempt_head[k] = head.get("node_id")
            self.started(k, jobs[k]["submission_id"], adopted=True,
                         started=_iso_ms(jobs[k].get("start_time")) or now_iso())
            return None
        n = max([n, *(k + 1 for k in jobs)])
        sid = rules.attempt_submission_id(spec.submission_id, n)
        body = spec.first_job if n == 1 else (spec.resume_job or spec.first_job)
        if n > 1:
            self.resumed_iteration[n] = self.latest_iteration()
        try:
            created, said = self.api.submit(sid, body.entrypoint, body.runtime_env, body.metadata)
        except rh.Unreachable as e:
            return self.finish("FAILED", f"submitting attempt {n} ({sid}): the head did not answer ({e})", broken=True)
        if not created and self.patiently("the job", lambda: self.api.job(sid)) is None:
            return self.finish("FAILED", f"Ray refused attempt {n} ({sid}): {said}")
        self.attempt_head[n] = head.get("node_id")
        self.started(n, sid, adopted=not created, started=now_iso())
        return None

    # -- retention --------------------------------------------------------------------------------------------
    def prune(self, n: int, live: bool) -> None:
        """The retention after a new complete checkpoint (``live``: attempt ``n`` runs) or after attempt ``n`` ended
        (its checkpoints newer than the tracker are partial: a dead attempt's when it did not succeed). Each deletion
        is one ``checkpoint_deleted`` event. Never fails the supervisor."""
        if not self.retention.active or not self.spec.checkpoint_dir:
            return
        try:
            self._prune(n, live)
        except OSError as e:
            print(f"supervise.py: retention skipped ({e})", file=sys.stderr, flush=True)

    def _prune(self, n: int, live: bool) -> None:
        latest = self.latest_iteration()
        self.pruned_for = latest
        dirs = cd.iteration_dirs(self.spec.checkpoint_dir)
        if not live:
            self.scores.feed(n, "", final=True)  # its last line, even without its newline
        for it in list(self.dead):
            if it not in dirs or cd.signature(dirs[it]) != self.dead[it]:
                del self.dead[it]  # gone, or written again since (a complete one once the tracker passed it)
        newer = [it for it in dirs if latest is None or it > latest]
        if not live:
            for it in newer:
                self.dead.setdefault(it, cd.signature(dirs[it]))
        partial = set(newer) | set(self.dead)
        complete = [it for it in dirs if it not in partial]
        protected: dict[int, str] = {}
        loads = self.resumed_iteration.get(n)
        if loads is not None:
            protected[loads] = f"attempt {n} loaded it"
        for it, path in dirs.items():
            if os.path.exists(os.path.join(path, sv.REGISTERED_MARKER)):
                protected[it] = "registered (a model version)"
        for kept in sv.retention_plan(self.retention, complete, self.scores, partial=partial, dead=self.dead,
                                      protected=protected):
            path = dirs[kept.iteration]
            if kept.keep or kept.iteration in self.undeletable:
                continue
            if not cd.inside(self.spec.checkpoint_dir, path):
                continue  # never anything outside the run's own checkpoint dir
            size = cd.size(path)
            try:
                shutil.rmtree(path)
            except OSError as e:
                self.undeletable.add(kept.iteration)
                print(f"supervise.py: could not delete {path} ({e})", file=sys.stderr, flush=True)
                continue
            self.dead.pop(kept.iteration, None)
            self.emit("checkpoint_deleted", iteration=kept.iteration, path=path, bytes=size, why=kept.why, attempt=n,
                      at=now_iso(), kept=self.retention.describe())

    def watch(self, n: int) -> tuple[rules.Verdict, int | None]:
        """Follow attempt ``n`` until it ended or was lost with its head: its verdict and last training step."""
        sid = rules.attempt_submission_id(self.spec.submission_id, n)
        unreachable_since = None
        next_log_read = 0.0
        while True:
            try:
                job = self.api.job(sid)
                head = self.current_head()
            except rh.NO_ANSWER as e:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > max(self.spec.workers_timeout, 30.0):
                    return rules.Verdict("failed", f"the Ray head did not answer for {self.spec.workers_timeout:.0f}s "
                                                f"({e})"), self.steps.get(n)
                self.sleep()
                continue
            unreachable_since = None
            if time.monotonic() >= next_log_read:
                self.read_logs(n, sid)
                next_log_read = time.monotonic() + max(LOG_READ_SECONDS, self.spec.poll_seconds)
            if self.retention.active and self.latest_iteration() != self.pruned_for:
                self.read_logs(n, sid)  # the evals logged so far (the best is judged on them)
                self.prune(n, live=True)
            if job is None:
                lost = f"the head serving now ({(head.get('node_id') or '?')[:16]}) has no job {sid}"
                return rules.classify("FAILED", lost=lost), self.steps.get(n)
            status = job.get("status")
            if status in sv.FINAL:
                self.read_logs(n, sid)
                return rules.classify(status, job.get("message"), self.logs_seen.get(n), job.get("driver_exit_code")), \
                    self.steps.get(n)
            lost = rules.lost_with_head(job, head, self.attempt_head.get(n))
            if lost:
                return rules.classify("FAILED", job.get("message"), self.logs_seen.get(n), lost=lost), self.steps.get(n)
            self.sleep()

    def wait_for_workers(self, after: rules.Verdict | None = None) -> bool:
        """Until ``gpu_workers`` GPU workers are in Ray (saying so while fewer are), up to ``workers_timeout``
        seconds, counted by the rule of every wait for GPU workers (``supervision.gpu_workers_ready``). The
        supervisor has no view of the pods, so after an attempt that may have lost a node (``after``: its verdict;
        None: not known) the nodes ALIVE when the wait starts count only once Ray has had ``NODE_DEATH_SECONDS`` to
        find a lost one dead: a deleted pod's node, still listed ALIVE until then, never stands in for its
        replacement. Nodes that joined since count at once."""
        want = self.spec.gpu_workers
        if want <= 0:
            return True
        deadline = time.time() + self.spec.workers_timeout
        suspect: set[str] = set()
        if after is None or rules.node_loss_possible(after):
            try:
                suspect = {n.get("node_id") for n in self.api.nodes() if n.get("state") == "ALIVE"}
            except rh.NO_ANSWER:
                pass  # nothing seen ALIVE: whatever joins later is new
        # (a wait shorter than twice that -- never one submit makes -- confirms them halfway)
        settled = time.monotonic() + min(rules.NODE_DEATH_SECONDS, self.spec.workers_timeout / 2)
        said = None
        while True:
            try:
                have = len(rules.gpu_workers_ready(self.api.nodes(), self.spec.gpus_per_node,
                                                    suspect=suspect if time.monotonic() < settled else ()))
            except rh.NO_ANSWER:
                have = 0
            if have >= want:
                return True
            if have != said:
                self.emit("waiting_for_workers", have=have, want=want,
                          deadline=_dt.datetime.fromtimestamp(deadline, _dt.timezone.utc).isoformat(timespec="seconds"))
                said = have
            if time.time() > deadline:
                return False
            self.sleep()


def _iso_ms(ms: Any) -> str | None:
    if not isinstance(ms, (int, float)) or ms <= 0:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Supervise one miles-ray run on its Ray head.")
    parser.add_argument("--spec", required=True, help="the supervisor spec (JSON file)")
    args = parser.parse_args(argv)
    try:
        with open(args.spec, encoding="utf-8") as fh:
            spec = sv.SupervisorSpec.of(json.load(fh))
    except (OSError, ValueError) as e:
        print(f"supervise.py: cannot use spec {args.spec}: {e}", file=sys.stderr, flush=True)
        return 2
    sup = Supervisor(spec, rh.RayHead(spec.head_url, token_file=spec.token_file), load_reporter(spec))

    def signalled(signum: int, _frame: Any) -> None:
        sup.emit("supervisor_signalled", signal=signal.Signals(signum).name, at=now_iso())
        raise SystemExit(1)

    signal.signal(signal.SIGTERM, signalled)
    try:
        return sup.main()
    except rh.Refused as e:
        return sup.finish("FAILED", f"the Ray head at {spec.head_url} refused the supervisor: {e}", broken=True)


if __name__ == "__main__":
    sys.exit(main())
