"""A run whose job is a Ray job on its head (direct mode, rehearsals, the launcher run from here): submitted,
read, followed and stopped through the head's Jobs API (a port-forward for a head on Kubernetes). Once the head
(or its job) is gone, its state and logs come from the saved copy (:mod:`miles_ray.services.saved_runs`)."""

from __future__ import annotations

import datetime as _dt
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.ray_head import local_head_gone, open_head, serving_pod
from miles_ray.controller.rules import lost_with_head
from miles_ray.core.errors import ClusterError, ConfigError, Conflict, JobFailed, NotFound, TimedOut
from miles_ray.core.records import Attempt, RunRecord, as_record
from miles_ray.core.runs import (ENDED, JobInfo, JobSubmitted, RunStatus, SavedCopySource, Stopped, head_change,
                                 head_identity)
from miles_ray.core.submission import SubmitJob
from miles_ray.services import saved_runs


def job_or_none(url: str, job_id: str) -> JobInfo | None:
    """The job's info, or None when the head has no job of that id."""
    try:
        return JobInfo.of(ray_jobs.status(url, job_id))
    except NotFound:
        return None


def _same_job(rec: RunRecord) -> tuple:
    """What two submits of one run share when they make the same Ray job: the head, the job id, the recipe."""
    return rec.address, rec.submission_id, rec.recipe_hash


class RayJob:
    """The Ray job of ``record`` on its head. ``kube_context``/``kubeconfig`` override how the record says its
    head on Kubernetes is reached; ``url``: the head already open (submit holds it)."""

    def __init__(self, record: RunRecord | dict[str, Any], *, kube_context: str | None = None,
                 kubeconfig: str | None = None, url: str | None = None) -> None:
        self.record = as_record(record)
        self.kube_context = kube_context
        self.kubeconfig = kubeconfig
        self.url = url

    @contextmanager
    def _head(self) -> Iterator[str]:
        rec = self.record
        with (nullcontext(self.url) if self.url else
              open_head(rec.address, kube_context=self.kube_context or rec.kube_context,
                        kubeconfig=self.kubeconfig or rec.kubeconfig)) as url:
            yield url

    # -- the head the job started on, against the head serving now ------------------------------------------------

    def _mark_lost(self, why: str, now: dict[str, Any] | None) -> Attempt:
        at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.record = self.record.mark_lost(at, why, now)
        state.save_record(self.record)
        return self.record.lost_attempt() or Attempt()

    def lost_on(self, url: str, info: JobInfo | None) -> Attempt | None:
        """The run's current attempt, marked lost in its record, when its job died with the head it started on:
        the head serving ``url`` is another (another pod, or Ray's head node id differs) and the job (``info``:
        as that head has it, None: it has none) did not end and runs on no ALIVE node. None otherwise, and for a
        record that predates head identities."""
        rec = self.record
        if rec.lost_attempt():
            return rec.lost_attempt()
        recorded = rec.head.model_dump() if rec.head is not None else None
        if not recorded or (info is not None and info.status in ENDED):
            return None
        if info is None:
            saved = saved_runs.saved_status(rec)
            if saved is not None and saved.status in ENDED:
                return None
        pod = serving_pod(url)
        if pod and recorded.get("pod_uid") and pod.get("pod_uid") != recorded["pod_uid"] and (
                info is None or info.driver_node_id in (None, recorded.get("node_id"))):
            # another head pod, and the job's driver ran in the one that is gone: lost, whatever Ray's job table
            # (kept by GCS fault tolerance) still says. Ray's new head node id is said if its state API answers.
            try:
                node_id = ray_jobs.head_node(url, timeout=2)["node_id"]
            except ClusterError:
                node_id = None
            now = head_identity(node_id, pod)
            why = head_change(recorded, now)
        else:  # THE head-loss rule, the run supervisor's (miles_ray.controller.rules.lost_with_head)
            ray_head = ray_jobs.head_node(url)
            now = head_identity(ray_head["node_id"], pod)
            lost = lost_with_head({"driver_node_id": info.driver_node_id, "start_time": info.start_time}
                                  if info is not None else {}, ray_head, recorded.get("node_id"))
            if lost is None:
                return None
            why = head_change(recorded, now) or lost
        return self._mark_lost(why, now)

    def head_lost(self) -> Attempt | None:
        """The run's current attempt if its job was lost with its head (compared with the head serving now;
        marked so in the record), else None. Unreachable is not lost, except for a local head whose process died."""
        try:
            with self._head() as url:
                return self.lost_on(url, job_or_none(url, self.record.submission_id))
        except ClusterError:
            return self._lost_when_unreachable()

    def refuse_if_running(self, url: str, info: JobInfo | None) -> None:
        """Before another attempt of the run: its job (``info``, as the head serving ``url`` has it) must not be
        running on a node ALIVE there (``Conflict`` if it is: a second driver would run beside it)."""
        if info is None or info.status in ENDED:
            return
        if info.driver_node_id in ray_jobs.head_node(url)["alive"]:
            raise Conflict(f"run {self.record.run}: its job {info.job_id} is {info.status} on ALIVE node "
                           f"{info.driver_node_id} of the head now serving: not starting another",
                           hint=f"stop it first ('miles-ray stop {self.record.run}')")

    def _lost_when_unreachable(self) -> Attempt | None:
        """The head does not answer: the attempt is lost when its head is known gone (a local head whose process
        died), else None (unreachable is not lost)."""
        rec = self.record
        if rec.lost_attempt():
            return rec.lost_attempt()
        if not rec.head:
            return None
        saved = saved_runs.saved_status(rec)
        if saved is not None and saved.status in ENDED:
            return None
        why = local_head_gone(rec.address)
        return self._mark_lost(why, None) if why else None

    def _lost_logs(self, lost: Attempt,
                   on_saved_copy: Callable[[SavedCopySource], None] | None) -> Iterator[str]:
        saved = saved_runs.saved_logs(self.record)
        if saved is None:
            raise JobFailed(f"run {self.record.run}: the job FAILED, {lost.reason}; its driver logs went "
                            "with that head (no copy was saved)",
                            hint=f"'miles-ray submit' of the same run starts its next attempt")
        if on_saved_copy:
            on_saved_copy(saved.source)
        yield saved.logs

    def submit(self, job: SubmitJob) -> JobSubmitted:
        """Record the run (unless it is recorded) and submit its job; a record written here goes again when Ray
        does not take the job (a new attempt's record: the run's record before it is put back)."""
        owns_record = False
        if job.existing is None:
            try:
                state.create_record(job.record) if not (job.resumed_from or job.replaces) else \
                    state.save_record(job.record)
                owns_record = True
            except ConfigError:
                # A concurrent submit of this same run wrote the record first: same job id, so Ray keeps one job.
                other, mine = state.read_json(state.record_path(job.run)), as_record(job.record)
                if not other or _same_job(as_record(other)) != _same_job(mine):
                    raise
        with self._head() as url:
            try:
                job_id, created_now = ray_jobs.submit(url, job.entrypoint, job.runtime_env, job.submission_id,
                                                      job.metadata)
            except BaseException:
                if owns_record and job.replaces is not None:
                    state.save_record(job.replaces)
                elif owns_record:
                    state.record_path(job.run).unlink(missing_ok=True)
                raise
            return JobSubmitted(run=job.run, submission_id=job_id, created=created_now, address=job.address,
                                record=str(state.record_path(job.run)), output_dir=job.output_dir,
                                entrypoint=job.entrypoint, status=ray_jobs.status(url, job_id)["status"])

    def state(self) -> RunStatus:
        """The job's info from its head; once the head (or its job) is gone, from the saved copy (``saved_copy``
        says where and when it was saved). A job seen ended is saved."""
        rec = self.record
        lost = rec.lost_attempt()
        if lost:
            return RunStatus.of_lost(rec, lost)
        try:
            with self._head() as url:
                try:
                    info = ray_jobs.status(url, rec.submission_id)
                except NotFound:
                    lost = self.lost_on(url, None)
                    if lost:
                        return RunStatus.of_lost(self.record, lost)
                    raise
                lost = self.lost_on(url, JobInfo.of(info))
                if lost:
                    return RunStatus.of_lost(self.record, lost)
                saved_runs.save_if_ended(rec, url, info)
            job = JobInfo.of(info)
        except ClusterError:
            lost = self._lost_when_unreachable()
            if lost:
                return RunStatus.of_lost(self.record, lost)
            saved = saved_runs.saved_status(rec)
            if saved is None:
                raise
            job = saved
        return RunStatus.of_job(rec, job)

    def live_state(self) -> str:
        """The job's state, ``UNREACHABLE`` when its head does not answer, ``UNKNOWN`` when it has no such job."""
        if self.record.lost_attempt():
            return "FAILED"
        try:
            with self._head() as url:
                job = job_or_none(url, self.record.submission_id)
                if self.lost_on(url, job):
                    return "FAILED"
        except ClusterError:
            return "FAILED" if self._lost_when_unreachable() else "UNREACHABLE"
        return job.status if job else "UNKNOWN"

    def logs(self, follow: bool, on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
        """The job's driver logs from its head (followed until the job ends: then they are saved); once the head
        (or its job) is gone, the saved copy, after calling ``on_saved_copy`` with where and when it was saved."""
        rec = self.record
        lost = rec.lost_attempt()
        if lost:
            yield from self._lost_logs(lost, on_saved_copy)
            return
        yielded = False
        try:
            with self._head() as url:
                if rec.head:
                    lost = self.lost_on(url, job_or_none(url, rec.submission_id))
                if lost:
                    yielded = True
                    yield from self._lost_logs(lost, on_saved_copy)
                    return
                if follow:
                    for chunk in ray_jobs.follow_logs(url, rec.submission_id):
                        yielded = True
                        yield chunk
                    saved_runs.save_if_ended(rec, url, ray_jobs.status(url, rec.submission_id))
                else:
                    text = ray_jobs.logs(url, rec.submission_id)
                    yielded = True
                    yield text
        except ClusterError:
            lost = None if yielded else self._lost_when_unreachable()
            if lost:
                yield from self._lost_logs(lost, on_saved_copy)
                return
            saved = None if yielded else saved_runs.saved_logs(rec)
            if saved is None:
                raise
            if on_saved_copy:
                on_saved_copy(saved.source)
            yield saved.logs

    def stop(self, wait_timeout: float | None = 60) -> Stopped:
        """Ask Ray to stop the job, then (unless ``wait_timeout`` is None) wait until it has ended, like
        ``ray job stop``: a stop returns once the job no longer holds its GPUs. ``TimedOut`` names its state."""
        rec = self.record
        with self._head() as url:
            stopped = ray_jobs.stop(url, rec.submission_id)
            status = None
            if wait_timeout is not None:
                try:
                    info = ray_jobs.wait(url, rec.submission_id, timeout=wait_timeout)
                    status = info["status"]
                    saved_runs.save_if_ended(rec, url, info)
                except TimedOut as e:
                    raise TimedOut(f"run {rec.run}: stop requested, but {e}",
                                   hint=f"'miles-ray status {rec.run}' shows when it has ended") from None
        return Stopped(run=rec.run, submission_id=rec.submission_id, stopped=stopped, status=status)
