"""Saved copies of a run's jobs: their driver logs and job info, kept next to the run record so that 'logs RUN' and
'status RUN' still answer once the cluster is gone.

A copy is saved when a run's job is seen to end (``logs -f``, ``status RUN``, ``submit -f``, ``stop``; every ended
attempt of a supervised run when its ``status`` or ``logs`` are read) and, for every job of every run recorded on a
cluster (each attempt of a supervised run: the head's jobs ``<it>``, ``<it>-a2`` ...), just before ``down`` or
``park`` takes that cluster. Attempt 1 (a run's only job, unless supervised) is saved in ``runs/RUN.saved/``, attempt
N in ``runs/RUN.saved/attempt-N/`` (:func:`miles_ray.adapters.state.saved_attempt_dir`); a supervised run's
supervisor events go beside them (``supervisor-events.json``, :data:`SAVED_EVENTS`). The live head is always asked
first; the saved copy is read only when the head (or its job) is no longer there.

A record given here names the job it is about by its ``submission_id``; the copy of an attempt's job (its own
submission id) also carries ``run_submission_id``, the run's (:func:`_attempt_record`).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.heads import parse_head
from miles_ray.core.records import RunRecord, as_record
from miles_ray.core.runs import JobInfo, SavedCopySource, SavedJob, SavedLogs, SavedRuns
from miles_ray.core.supervision import attempt_of, attempt_submission_id

Record = RunRecord | Mapping[str, Any]  # a run record, typed or as written
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
SAVED_EVENTS = "supervisor-events.json"  # a supervised run's supervisor events, in its saved copy dir

__all__ = ["SAVED_EVENTS", "TERMINAL", "has_final_copy", "records_on", "save_cluster_runs",
           "save_events", "save_from_head", "save_if_ended", "saved_logs", "saved_status"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _attempt_record(rec: RunRecord, attempt: int) -> RunRecord:
    """The record of one attempt's job of the run ``rec`` (its submission id; ``run_submission_id``: the run's)."""
    return rec.job_of_attempt(attempt_submission_id(rec.run_submission_id or rec.submission_id, attempt))


def _attempt(rec: RunRecord) -> int:
    """Which attempt of its run ``rec``'s job is (1 for a run's own submission id)."""
    return attempt_of(rec.run_submission_id or rec.submission_id, rec.submission_id) or 1


def save_from_head(record: Record, url: str, reason: str, info: dict | None = None) -> SavedJob | None:
    """Save the job info and driver logs of ``rec``'s job from the head at ``url``; None when the head has no such
    job. ``info``: the job info when the caller has just read it."""
    rec = as_record(record)
    sid = rec.submission_id
    try:
        info = dict(info) if info is not None else ray_jobs.status(url, sid)
        logs = ray_jobs.logs(url, sid)
    except NotFound:
        return None
    info.pop("runtime_env", None)
    info["submission_id"] = sid
    path = state.save_run_copy(rec.run, info, logs, reason, _now(), attempt=_attempt(rec))
    return SavedJob(run=rec.run, status=info.get("status"), dir=str(path))


def save_if_ended(record: Record, url: str, info: dict[str, Any]) -> None:
    """Once the job has ended, save it (once: an up-to-date copy is not written again). Never fails the caller:
    the live answer it already has matters more than the copy."""
    if info.get("status") not in TERMINAL:
        return
    rec = as_record(record)
    saved = state.load_run_copy(rec.run, _attempt(rec))
    keys = ("submission_id", "status", "end_time")
    if saved and [saved["job"].get(k) for k in keys] == [rec.submission_id, info.get("status"), info.get("end_time")]:
        return
    try:
        save_from_head(rec, url, f"the job ended ({info.get('status')})", info)
    except ClusterError:
        pass


def _copy_of(rec: RunRecord) -> dict[str, Any] | None:
    # an attempt's copy in its own dir; one saved before attempts had dirs of their own is in the run's dir
    for attempt in dict.fromkeys((_attempt(rec), 1)):
        saved = state.load_run_copy(rec.run, attempt)
        if saved is not None and saved.get("job", {}).get("submission_id") == rec.submission_id:
            return saved
    return None


def has_final_copy(record: Record) -> bool:
    """Whether ``rec``'s job has a saved copy taken after it ended (an ended job's logs no longer change)."""
    saved = _copy_of(as_record(record))
    return saved is not None and saved["job"].get("status") in TERMINAL


def save_events(run: str, events: list[dict[str, Any]]) -> None:
    """Keep a supervised run's supervisor events in its saved copy (:data:`SAVED_EVENTS`)."""
    if events:
        state.atomic_write_json(state.saved_dir(run) / SAVED_EVENTS, events)


def _source(saved: dict[str, Any]) -> SavedCopySource:
    return SavedCopySource(dir=saved["dir"], saved_at=saved.get("saved_at"), reason=saved.get("reason"))


def saved_status(record: Record) -> JobInfo | None:
    """The job info of the saved copy (``saved_copy`` says where and when it was saved), or None. A job that was
    still running when 'down' saved it ended with its cluster: it is reported STOPPED, saying so."""
    saved = _copy_of(as_record(record))
    if saved is None:
        return None
    info = dict(saved["job"])
    if info.get("status") not in TERMINAL:
        info["message"] = (f"the job was {info.get('status')} when its cluster went down (saved at "
                           f"{saved.get('saved_at')}); it ended with the cluster")
        info["status"] = "STOPPED"
    job = JobInfo.of(info)
    job.saved_copy = _source(saved)
    return job


def saved_logs(record: Record) -> SavedLogs | None:
    """The driver logs of the saved copy and where they were saved, or None."""
    saved = _copy_of(as_record(record))
    return None if saved is None else SavedLogs(logs=saved["logs"], source=_source(saved))


def records_on(addresses: Iterable[str]) -> list[RunRecord]:
    """The run records whose head is one of ``addresses`` (``local://NAME``, ``k8s://NS/NAME``, dashboard URLs),
    compared as parsed head addresses."""
    def key(address: str) -> tuple | None:
        try:
            head = parse_head(address)
        except ConfigError:
            return None
        if head.kind == "url":
            return ("url", (head.url or "").rstrip("/"))
        return (head.kind, head.namespace, head.name)

    wanted = {key(a) for a in addresses} - {None}
    return [rec for rec in state.RunStore.all() if key(getattr(rec, "address", "")) in wanted]


def _known_attempts(rec: RunRecord) -> set[int]:
    """The attempts of ``rec``'s run its record knows of (a supervised run's ``attempts``; else its one job)."""
    out = {1}
    if rec.supervisor:
        out |= {a.attempt for a in rec.attempts or [] if isinstance(a.attempt, int)}
    return out


def _not_saved(rec: RunRecord, why: dict[int, str]) -> str | None:
    """One line for the jobs of ``rec``'s run that have no copy (``why``, by attempt), None: every one has."""
    if not why:
        return None
    if not rec.supervisor and list(why) == [1]:
        return why[1]
    return "; ".join(f"attempt {n}: {w}" for n, w in sorted(why.items()))


def _save_run_jobs(rec: RunRecord, url: str, jobs: list[dict[str, Any]], reason: str) -> str | None:
    """Save every job of ``rec``'s run (every attempt of a supervised run) that the head at ``url`` has (``jobs``: its
    job list); why not, in one line, for those of them and of the attempts the record knows of that have no copy
    (None: every one has)."""
    on_head = {}
    for job in jobs:
        n = attempt_of(rec.submission_id, job.get("job_id") or "")
        if n is not None:
            on_head[n] = job
    why = {}
    for n in sorted(set(on_head) | _known_attempts(rec)):
        arec = _attempt_record(rec, n)
        if n in on_head:
            try:
                save_from_head(arec, url, reason, on_head[n])
            except ClusterError as e:
                if _copy_of(arec) is None:
                    why[n] = str(e).splitlines()[0]
                continue
        if _copy_of(arec) is None:
            why[n] = "the head has no job of this run" if n == 1 and not rec.supervisor else \
                f"the head has no job {arec.submission_id}"
    return _not_saved(rec, why)


def save_cluster_runs(records: list[RunRecord] | list[dict[str, Any]], head_address: str, *, kube_context: str | None = None,
                      kubeconfig: str | None = None, reason: str = "down") -> SavedRuns:
    """Before a cluster goes away: save every job of every given run (each attempt of a supervised run) from its
    head (``head_address``). Returns the runs saved whole and, for each other, why not (naming the attempts whose
    copy is missing); never raises for a head that cannot be reached (the cluster is going down anyway: the caller
    reports what could not be saved)."""
    out = SavedRuns(saved=[], not_saved={})
    if not records:
        return out
    records = [as_record(r) for r in records]
    try:
        with open_head(head_address, kube_context=kube_context, kubeconfig=kubeconfig) as url:
            jobs = ray_jobs.list_jobs(url)
            for rec in records:
                why = _save_run_jobs(rec, url, jobs, reason)
                if why is None:
                    out.saved.append(rec.run)
                else:
                    out.not_saved[rec.run] = why
    except ClusterError as e:
        done = set(out.saved) | set(out.not_saved)
        for rec in records:
            if rec.run in done:
                continue
            said = f"the head did not answer ({str(e).splitlines()[0]})"
            why = _not_saved(rec, {n: said for n in _known_attempts(rec) if _copy_of(_attempt_record(rec, n)) is None})
            if why is None:
                out.saved.append(rec.run)  # saved earlier, when its jobs ended
            else:
                out.not_saved[rec.run] = why
    return out
