"""A run whose job is a Ray job on its head (direct mode, rehearsals, the launcher run from here): submitted,
read, followed and stopped through the head's Jobs API (a port-forward for a head on Kubernetes). Once the head
(or its job) is gone, its state and logs come from the saved copy (:mod:`miles_ray.services.saved_runs`)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.errors import ClusterError, ConfigError, NotFound, TimedOut
from miles_ray.core.runs import JobInfo, JobSubmitted, RunStatus, SavedCopySource, Stopped
from miles_ray.core.submission import SubmitJob
from miles_ray.services import saved_runs


def job_or_none(url: str, job_id: str) -> JobInfo | None:
    """The job's info, or None when the head has no job of that id."""
    try:
        return JobInfo.of(ray_jobs.status(url, job_id))
    except NotFound:
        return None


class RayJob:
    """The Ray job of ``record`` on its head. ``kube_context``/``kubeconfig`` override how the record says its
    head on Kubernetes is reached; ``url``: the head already open (submit holds it)."""

    def __init__(self, record: dict[str, Any], *, kube_context: str | None = None, kubeconfig: str | None = None,
                 url: str | None = None) -> None:
        self.record = record
        self.kube_context = kube_context
        self.kubeconfig = kubeconfig
        self.url = url

    @contextmanager
    def _head(self) -> Iterator[str]:
        rec = self.record
        with (nullcontext(self.url) if self.url else
              open_head(rec["address"], kube_context=self.kube_context or rec.get("kube_context"),
                        kubeconfig=self.kubeconfig or rec.get("kubeconfig"))) as url:
            yield url

    def submit(self, job: SubmitJob) -> JobSubmitted:
        """Record the run (unless it is recorded) and submit its job; a record written here goes again when Ray
        does not take the job."""
        owns_record = False
        if job.existing is None:
            try:
                state.create_record(job.record) if not job.resumed_from else state.save_record(job.record)
                owns_record = True
            except ConfigError:
                # A concurrent submit of this same run wrote the record first: same job id, so Ray keeps one job.
                other = state.read_json(state.record_path(job.run))
                if not other or (other.get("address"), other.get("submission_id"), other.get("recipe_hash")) != (
                        job.record["address"], job.record["submission_id"], job.record["recipe_hash"]):
                    raise
        with self._head() as url:
            try:
                job_id, created_now = ray_jobs.submit(url, job.entrypoint, job.runtime_env, job.submission_id,
                                                      job.metadata)
            except BaseException:
                if owns_record:
                    state.record_path(job.run).unlink(missing_ok=True)
                raise
            return JobSubmitted(run=job.run, submission_id=job_id, created=created_now, address=job.address,
                                record=str(state.record_path(job.run)), output_dir=job.output_dir,
                                entrypoint=job.entrypoint, status=ray_jobs.status(url, job_id)["status"])

    def state(self) -> RunStatus:
        """The job's info from its head; once the head (or its job) is gone, from the saved copy (``saved_copy``
        says where and when it was saved). A job seen ended is saved."""
        rec = self.record
        try:
            with self._head() as url:
                info = ray_jobs.status(url, rec["submission_id"])
                saved_runs.save_if_ended(rec, url, info)
            job = JobInfo.of(info)
        except ClusterError:
            saved = saved_runs.saved_status(rec)
            if saved is None:
                raise
            job = saved
        return RunStatus.of_job(rec, job)

    def live_state(self) -> str:
        """The job's state, ``UNREACHABLE`` when its head does not answer, ``UNKNOWN`` when it has no such job."""
        try:
            with self._head() as url:
                job = job_or_none(url, self.record["submission_id"])
        except ClusterError:
            return "UNREACHABLE"
        return job.status if job else "UNKNOWN"

    def logs(self, follow: bool, on_saved_copy: Callable[[SavedCopySource], None] | None = None) -> Iterator[str]:
        """The job's driver logs from its head (followed until the job ends: then they are saved); once the head
        (or its job) is gone, the saved copy, after calling ``on_saved_copy`` with where and when it was saved."""
        rec = self.record
        yielded = False
        try:
            with self._head() as url:
                if follow:
                    for chunk in ray_jobs.follow_logs(url, rec["submission_id"]):
                        yielded = True
                        yield chunk
                    saved_runs.save_if_ended(rec, url, ray_jobs.status(url, rec["submission_id"]))
                else:
                    text = ray_jobs.logs(url, rec["submission_id"])
                    yielded = True
                    yield text
        except ClusterError:
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
            stopped = ray_jobs.stop(url, rec["submission_id"])
            status = None
            if wait_timeout is not None:
                try:
                    info = ray_jobs.wait(url, rec["submission_id"], timeout=wait_timeout)
                    status = info["status"]
                    saved_runs.save_if_ended(rec, url, info)
                except TimedOut as e:
                    raise TimedOut(f"run {rec['run']}: stop requested, but {e}",
                                   hint=f"'miles-ray status {rec['run']}' shows when it has ended") from None
        return Stopped(run=rec["run"], submission_id=rec["submission_id"], stopped=stopped, status=status)
