"""A supervised run (``submit --max-restarts N``, N > 0): its attempts are submitted and carried through failures by
its supervisor (the program ``launchers/supervise.py``), which lives beside the cluster: a detached process here
(:class:`miles_ray.adapters.local_ray.supervisor.LocalSupervisor`), a Kubernetes Job, or the Polyaxon run. submit
starts the supervisor and returns; the supervisor submits attempt 1 itself (one submitter).

:class:`SupervisedRun` is the run backend of such a run (``backend_for`` picks it when the record has a
``supervisor``): its state is the supervisor's final status once it finished, else its current attempt's (a Ray
job, read through :class:`miles_ray.services.runs.ray_job.RayJob`); its logs are every attempt's in order; stop
stops the current attempt's job, then the supervisor, then any attempt started meanwhile.

A kind of supervisor is one class with the :class:`SupervisorHandle` methods, registered in :data:`HANDLES`.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Protocol

from miles_ray.adapters import ray_auth, ray_jobs, state
from miles_ray.adapters.local_ray.supervisor import LocalSupervisor
from miles_ray.adapters.ray_head import local_token_path
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.records import Attempt as RecordedAttempt, Controller, RunRecord, as_record
from miles_ray.core.runs import Attempt, JobSubmitted, RunStatus, SavedCopySource, Stopped, SupervisorState
from miles_ray.core.submission import SubmitJob
from miles_ray.core.supervision import (LIVE, attempt_of, attempt_submission_id, final_status,
                                        fold_attempts, resumed_at)
from miles_ray.services import saved_runs
from miles_ray.services.runs.ray_job import RayJob
from miles_ray.services.runs.supervised_kube import KubeSupervisor

# an attempt's job ended so, while its supervisor is alive and has not finished: it may still retry
UNDECIDED = frozenset({"FAILED", "STOPPED"})


class SupervisorHandle(Protocol):
    """One run's supervisor, wherever it lives. ``kind``: ``local`` | ``kubernetes``."""

    kind: str

    def start(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start the supervisor with ``spec`` (the JSON of ``miles_ray.core.supervision.SupervisorSpec``); return
        where it is (kept in the run record's ``supervisor.where``, given back to the handle's constructor)."""

    def events(self) -> list[dict[str, Any]]:
        """Its events so far (parsed ``MILES_RAY_SUPERVISOR`` lines), oldest first."""

    def alive(self) -> bool | None:
        """Whether it still runs (None: not known)."""

    def stop(self) -> None:
        """Stop it (nothing it would submit after this)."""

    def token_file(self, token: str) -> str:
        """Where the supervisor reads the head's token from, given the token (a file it can read; a pod: where
        the head's token Secret is mounted)."""

    def head_url(self, reached: str, in_cluster: str) -> str:
        """The head's Jobs API URL as the supervisor reaches it: ``reached`` (the URL this process opened, e.g. a
        port-forward) or ``in_cluster`` (the head service's, from inside the cluster)."""


# kind -> the handle of a run: factory(run name, the record's supervisor.where)
HANDLES: dict[str, Callable[[str, dict[str, Any] | None], SupervisorHandle]] = {
    "local": LocalSupervisor,
    "kubernetes": KubeSupervisor,
}


def handle_for(record: RunRecord | dict[str, Any]) -> SupervisorHandle:
    rec = as_record(record)
    sup = rec.supervisor or Controller()
    factory = HANDLES.get(sup.kind or "")
    if factory is None:
        raise ConfigError(f"run {rec.run} has a supervisor of kind {sup.kind!r}, which this miles-ray "
                          "does not know", hint="upgrade miles-ray")
    return factory(rec.run, sup.where)


def stop_supervisors(records: list[RunRecord] | list[dict[str, Any]]) -> list[str]:
    """Stop the supervisor of every supervised run in ``records`` (their cluster is going down: nothing could carry
    them on); the runs whose supervisor was stopped."""
    stopped = []
    for rec in map(as_record, records):
        if rec.supervisor:
            handle_for(rec).stop()
            stopped.append(rec.run)
    return stopped


def save_supervisor_events(records: list[RunRecord] | list[dict[str, Any]]) -> None:
    """Keep the supervisor events of every supervised run in ``records`` in its saved copy (their cluster is going
    down or being parked: a supervisor beside it may go with it); a supervisor that cannot be read is skipped."""
    for rec in map(as_record, records):
        if rec.supervisor:
            try:
                saved_runs.save_events(rec.run, handle_for(rec).events())
            except (ClusterError, ConfigError):
                continue


def supervisor_kinds() -> frozenset[str]:
    """The kinds of supervisor this miles-ray can start."""
    return frozenset(HANDLES)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class SupervisedRun:
    """The run backend of a supervised run (see the module docstring)."""

    def __init__(self, record: RunRecord | dict[str, Any], *, kube_context: str | None = None,
                 kubeconfig: str | None = None, url: str | None = None) -> None:
        self.record = as_record(record)
        self.kube_context = kube_context
        self.kubeconfig = kubeconfig
        self.url = url

    # -- submit ------------------------------------------------------------------------------------------------
    def submit(self, job: SubmitJob) -> JobSubmitted:
        """Record the run and start its supervisor (which submits attempt 1). The record goes again when the
        supervisor cannot be started."""
        if self.url is None:
            raise ClusterError(f"run {job.run}: no head to supervise")
        handle = HANDLES[as_record(job.record).supervisor.kind](job.run, None)
        token_file = local_token_path(self.url)
        if token_file is None and ray_auth.token_for(self.url):
            token_file = handle.token_file(ray_auth.token_for(self.url) or "")
        # the supervisor submits through the Jobs API alone: a local working_dir (a rehearsal's launchers) goes
        # to the head first, as Ray's SDK would upload it
        job = replace(job, runtime_env=ray_jobs.upload_working_dir(self.url, job.runtime_env, job.submission_id))
        resume = (job.supervision or {}).get("resume_job")
        if resume and (resume.get("runtime_env") or {}).get("working_dir"):
            resume = {**resume, "runtime_env": ray_jobs.upload_working_dir(self.url, resume["runtime_env"],
                                                                           job.submission_id)}
            job = replace(job, supervision={**(job.supervision or {}), "resume_job": resume})
        record = as_record({**job.record, "attempts": []})
        # a resumed run shares the output dir of the run it resumes (as RayJob.submit: no create_record's refusal)
        state.create_record(record) if job.existing is None and not job.resumed_from else state.save_record(record)
        try:
            where = handle.start(job.supervisor_spec(handle.head_url(self.url, job.in_cluster_address), token_file))
        except BaseException:
            if job.existing is None:
                state.record_path(job.run).unlink(missing_ok=True)
            else:
                state.save_record(job.existing)
            raise
        record.supervisor = Controller.model_validate({**record.supervisor.model_dump(), "where": where,
                                                       "started": _now()})
        state.save_record(record)
        return JobSubmitted(run=job.run, submission_id=job.submission_id, created=True, address=job.address,
                            record=str(state.record_path(job.run)), output_dir=job.output_dir,
                            entrypoint=job.entrypoint, status="PENDING", max_restarts=record.supervisor.max_restarts)

    def revive(self) -> bool:
        """Start the run's supervisor again when it is gone before the run finished or was stopped (this machine
        rebooted, the process was killed): it adopts the running attempt or carries the run on. A handle without
        ``restart`` (a Kubernetes Job restarts its own pod) is left alone. True when it was started again."""
        handle = handle_for(self.record)
        restart = getattr(handle, "restart", None)
        _, _, final = self._events()
        if restart is None or final is not None or self._stopped_at():
            return False
        return bool(restart())

    # -- reading ------------------------------------------------------------------------------------------------
    def _events(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
        handle = handle_for(self.record)
        events = handle.events()
        if not events:  # the supervisor's own account is gone (its files, its pod): the copy kept with the run's
            saved = state.read_json(state.saved_dir(self.record.run) / saved_runs.SAVED_EVENTS)
            events = saved if isinstance(saved, list) else events
        return events, fold_attempts(events), final_status(events)

    def _stopped_at(self) -> str | None:
        return self.record.supervisor.stopped_at if self.record.supervisor is not None else None

    def _attempt_job(self, attempt: dict[str, Any]) -> RayJob:
        """The Ray job of one attempt (a record copy under the attempt's submission id; never saved)."""
        rec = self.record.job_of_attempt(attempt.get("submission_id") or attempt_submission_id(
            self.record.submission_id, attempt["attempt"]))
        rec.head, rec.attempts = None, None
        return RayJob(rec, kube_context=self.kube_context, kubeconfig=self.kubeconfig, url=self.url)

    def _save_ended(self, events: list[dict[str, Any]], attempts: list[dict[str, Any]]) -> None:
        """Keep a copy of every ended attempt's job (driver logs, job info) next to the run's record, and the
        supervisor's events: each attempt is saved once after it ended (from the head, opened once for all of them);
        never fails the caller (the cluster may be gone: then ``down``/``park`` saved them, or nothing can)."""
        ended = [a for a in attempts if a.get("ended") is not None
                 and not saved_runs.has_final_copy(self._attempt_job(a).record)]
        if ended:
            try:
                with RayJob(self.record, kube_context=self.kube_context, kubeconfig=self.kubeconfig,
                            url=self.url)._head() as url:  # noqa: SLF001 - the same head, opened once
                    for a in ended:
                        rec = self._attempt_job(a).record
                        try:
                            saved_runs.save_if_ended(rec, url, ray_jobs.status(url, rec.submission_id))
                        except ClusterError:
                            continue
            except ClusterError:
                pass
        if events and events != state.read_json(state.saved_dir(self.record.run) / saved_runs.SAVED_EVENTS):
            saved_runs.save_events(self.record.run, events)

    def _sync(self, attempts: list[dict[str, Any]]) -> None:
        """Keep the record's ``attempts`` as the supervisor says (``runs`` counts them)."""
        if attempts and attempts != [a.model_dump(mode="json") for a in self.record.attempts or []]:
            def keep(record: RunRecord) -> None:
                record.attempts = attempts

            try:  # under the record's lock: a 'stop' writing it meanwhile keeps its change, this one too
                self.record = state.RunStore.update(self.record.run, keep)
            except NotFound:  # its record went meanwhile (a failed submit took it back): nothing to keep
                self.record.attempts = attempts

    def supervisor_state(self, final: dict[str, Any] | None) -> SupervisorState:
        sup = self.record.supervisor or Controller()
        return SupervisorState(kind=sup.kind or "?", max_restarts=sup.max_restarts or 0,
                               alive=handle_for(self.record).alive(), finished=final.get("status") if final else None,
                               reason=final.get("reason") if final else None, stopped_at=sup.stopped_at)

    def state(self) -> RunStatus:
        rec = self.record
        events, attempts, final = self._events()
        self._sync(attempts)
        self._save_ended(events, attempts)
        sup = self.supervisor_state(final)
        views = [Attempt.of(a) for a in attempts]
        base = dict(run=rec.run, address=rec.address, output_dir=rec.output_dir, recipe=rec.recipe,
                    mode=rec.mode, attempts=views, supervisor=sup)
        current = attempts[-1] if attempts else None
        sid = (current or {}).get("submission_id") or rec.submission_id
        if final is not None:
            return RunStatus(submission_id=sid, status=final.get("status"), message=final.get("reason"), **base)
        if sup.stopped_at:
            return RunStatus(submission_id=sid, status="STOPPED", message=f"stopped at {sup.stopped_at}", **base)
        if current is None:
            if sup.alive:
                return RunStatus(submission_id=sid, status="PENDING", message="the supervisor is starting attempt 1",
                                 **base)
            return RunStatus(submission_id=sid, status="FAILED", message="the supervisor ended before it submitted "
                                                                         "attempt 1", **base)
        if current.get("ended") and sup.alive:  # between attempts: waiting for workers, or about to submit
            return RunStatus(submission_id=sid, status="PENDING", message=f"attempt {current['attempt']} ended "
                             f"({current.get('reason')}); {current.get('why')}", **base)
        job = self._attempt_job(current).state()
        data = job.model_dump(exclude_unset=True, exclude={"run", "address", "output_dir", "recipe", "mode",
                                                           "submission_id"})
        if sup.alive is False:
            data["message"] = (data.get("message") or "") + " (its supervisor is not running)"
        elif sup.alive and data.get("status") in UNDECIDED:
            # the attempt's job ended but its supervisor has not said yet whether it retries: not the run's end
            return RunStatus(submission_id=sid, status="PENDING", message=f"attempt {current['attempt']}'s job ended "
                             f"{data['status']} ({data.get('message') or 'no message'}); its supervisor is deciding "
                             "whether to retry", **base)
        return RunStatus(submission_id=sid, **{**data, **base})

    def live_state(self) -> str:
        try:
            _, attempts, final = self._events()
        except ConfigError:
            return "UNKNOWN"
        self._sync(attempts)
        if final is not None:
            return str(final.get("status"))
        if self._stopped_at():
            return "STOPPED"
        if not attempts or attempts[-1].get("ended"):
            return "PENDING"
        live = self._attempt_job(attempts[-1]).live_state()
        if live in UNDECIDED and handle_for(self.record).alive():
            return "PENDING"  # its supervisor has not decided yet whether it retries
        return live

    def head_lost(self) -> RecordedAttempt | None:
        return None  # the supervisor finds a lost head itself and starts the next attempt

    def logs(self, follow: bool, on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
        """Every attempt's logs in order, each after a header line; followed (``follow``) until the supervisor
        finished (or is gone). Read from the head, or, once it no longer has them (after ``down``), from each
        attempt's saved copy. An attempt whose logs can be read from neither is left out and named at the end, in
        one error line (``ClusterError``: the logs printed are not the run's whole logs)."""
        done: set[int] = set()
        unreadable: dict[int, str] = {}
        while True:
            events, attempts, final = self._events()
            alive = handle_for(self.record).alive()
            if not follow:
                self._save_ended(events, attempts)
            for a in attempts:
                n = a["attempt"]
                if n in done:
                    continue
                ended = a.get("ended") is not None or final is not None or not follow
                if not ended and not follow:
                    continue
                chunks = self._attempt_job(a).logs(follow and not ended, on_saved_copy)
                try:
                    first = next(chunks, None)  # read (or fail) before its header is printed
                    yield header(a)
                    if first is not None:
                        yield first
                    yield from chunks
                except ClusterError as e:
                    unreadable[n] = f"attempt {n} ({a.get('submission_id')}): {e.message.splitlines()[0]}"
                done.add(n)
            if not follow or final is not None or alive is False:
                break
            time.sleep(1.0)
        if unreadable:
            raise ClusterError(f"run {self.record.run}: the logs of {len(unreadable)} of {len(done)} attempts could "
                               f"not be read (neither on the head nor saved): {'; '.join(unreadable.values())}")

    # -- stop ---------------------------------------------------------------------------------------------------
    def stop(self, wait_timeout: float | None = 60) -> Stopped:
        """Stop the current attempt's job (a STOPPED attempt is never followed by another), then the supervisor,
        then any attempt of the run it started meanwhile. Nothing brings the run back."""
        rec = self.record
        _, attempts, final = self._events()
        current = attempts[-1] if attempts else None
        result = None
        if current is not None and not current.get("ended"):
            result = self._attempt_job(current).stop(wait_timeout)
        handle_for(rec).stop()
        stopped_more = self._stop_live_attempts()
        if final is None and not self._stopped_at():
            at = _now()

            def stopped(record: RunRecord) -> None:
                sup = record.supervisor or rec.supervisor or Controller()
                record.supervisor = Controller.model_validate({**sup.model_dump(mode="json"), "stopped_at": at})

            self.record = state.RunStore.update(rec.run, stopped)  # under the record's lock
        sid = (current or {}).get("submission_id") or rec.submission_id
        if result is not None:
            return Stopped(run=rec.run, submission_id=sid, stopped=result.stopped, status=result.status)
        return Stopped(run=rec.run, submission_id=sid, stopped=final is None or stopped_more,
                       status="STOPPED" if final is None else final.get("status"))

    def _stop_live_attempts(self) -> bool:
        """Stop every PENDING/RUNNING job of the run (an attempt submitted just before the supervisor stopped)."""
        rec, stopped = self.record, False
        job = RayJob(rec, kube_context=self.kube_context, kubeconfig=self.kubeconfig, url=self.url)
        try:
            with job._head() as url:  # noqa: SLF001 - the same head
                for info in ray_jobs.list_jobs(url):
                    sid = info.get("job_id") or ""
                    if attempt_of(rec.submission_id, sid) and info.get("status") in LIVE:
                        ray_jobs.stop(url, sid)
                        stopped = True
        except ClusterError:
            pass
        return stopped


def header(attempt: dict[str, Any]) -> str:
    """The line before an attempt's logs (``logs RUN``)."""
    n, sid = attempt["attempt"], attempt.get("submission_id")
    where = ""
    if attempt.get("resumed_from"):
        where = f", resumed from {resumed_at(attempt['resumed_from'], attempt.get('resumed_iteration'))}"
    return f"== attempt {n} ({sid}){where} ==\n"
