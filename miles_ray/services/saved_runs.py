"""Saved copies of a run's job: its driver logs and job info, kept next to the run record so that 'logs RUN' and
'status RUN' still answer once the cluster is gone.

A copy is saved when a run is seen to end (``logs -f``, ``status RUN``, ``submit -f``, ``stop``) and, for every
run recorded on a cluster, just before ``down`` deletes that cluster. The live head is always asked first; the
saved copy is read only when the head (or its job) is no longer there.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable

from miles_ray.adapters import ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.heads import parse_head
from miles_ray.core.runs import JobInfo, SavedCopySource, SavedJob, SavedLogs, SavedRuns

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})

__all__ = ["TERMINAL", "records_on", "save_cluster_runs", "save_from_head", "save_if_ended", "saved_logs",
           "saved_status"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def save_from_head(rec: dict[str, Any], url: str, reason: str, info: dict | None = None) -> SavedJob | None:
    """Save the job info and driver logs of ``rec``'s job from the head at ``url``; None when the head has no such
    job. ``info``: the job info when the caller has just read it."""
    sid = rec["submission_id"]
    try:
        info = dict(info) if info is not None else ray_jobs.status(url, sid)
        logs = ray_jobs.logs(url, sid)
    except NotFound:
        return None
    info.pop("runtime_env", None)
    info["submission_id"] = sid
    path = state.save_run_copy(rec["run"], info, logs, reason, _now())
    return SavedJob(run=rec["run"], status=info.get("status"), dir=str(path))


def save_if_ended(rec: dict[str, Any], url: str, info: dict[str, Any]) -> None:
    """Once the job has ended, save it (once: an up-to-date copy is not written again). Never fails the caller:
    the live answer it already has matters more than the copy."""
    if info.get("status") not in TERMINAL:
        return
    saved = state.load_run_copy(rec["run"])
    keys = ("submission_id", "status", "end_time")
    if saved and [saved["job"].get(k) for k in keys] == [rec["submission_id"], info.get("status"), info.get("end_time")]:
        return
    try:
        save_from_head(rec, url, f"the job ended ({info.get('status')})", info)
    except ClusterError:
        pass


def _copy_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    saved = state.load_run_copy(rec["run"])
    if saved is None or saved.get("job", {}).get("submission_id") != rec["submission_id"]:
        return None
    return saved


def _source(saved: dict[str, Any]) -> SavedCopySource:
    return SavedCopySource(dir=saved["dir"], saved_at=saved.get("saved_at"), reason=saved.get("reason"))


def saved_status(rec: dict[str, Any]) -> JobInfo | None:
    """The job info of the saved copy (``saved_copy`` says where and when it was saved), or None. A job that was
    still running when 'down' saved it ended with its cluster: it is reported STOPPED, saying so."""
    saved = _copy_of(rec)
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


def saved_logs(rec: dict[str, Any]) -> SavedLogs | None:
    """The driver logs of the saved copy and where they were saved, or None."""
    saved = _copy_of(rec)
    return None if saved is None else SavedLogs(logs=saved["logs"], source=_source(saved))


def records_on(addresses: Iterable[str]) -> list[dict[str, Any]]:
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
    return [rec for rec in state.list_records() if key(rec.get("address", "")) in wanted]


def save_cluster_runs(records: list[dict[str, Any]], head_address: str, *, kube_context: str | None = None,
                      kubeconfig: str | None = None, reason: str = "down") -> SavedRuns:
    """Before a cluster goes away: save every given run's job from its head (``head_address``). Returns the runs
    saved and, for each other, why not; never raises for a head that cannot be reached (the cluster is going down
    anyway: the caller reports what could not be saved)."""
    out = SavedRuns(saved=[], not_saved={})
    if not records:
        return out
    try:
        with open_head(head_address, kube_context=kube_context, kubeconfig=kubeconfig) as url:
            for rec in records:
                try:
                    got = save_from_head(rec, url, reason)
                except ClusterError as e:
                    out.not_saved[rec["run"]] = str(e).splitlines()[0]
                    continue
                if got is not None or _copy_of(rec) is not None:
                    out.saved.append(rec["run"])
                else:
                    out.not_saved[rec["run"]] = "the head has no job of this run"

    except ClusterError as e:
        for rec in records:
            if _copy_of(rec) is None:
                out.not_saved[rec["run"]] = f"the head did not answer ({str(e).splitlines()[0]})"
            else:
                out.saved.append(rec["run"])  # saved earlier, when its job ended
    return out
