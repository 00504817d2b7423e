"""Idle detection (shared by every backend: it asks Ray) and the gate every backend's 'park' passes first."""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any, Callable

from miles_ray.adapters import ray_jobs
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
from miles_ray.services.backends.results import IdleReport, ParkResult


def iso(ts: float | None) -> str | None:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def idle_report(url: str) -> IdleReport:
    """Is the cluster at ``url`` idle, and since when: no job pending or running and no active driver (the
    dashboard's activity API). ``since`` is the latest of: the last job's end, the head's start. ``idle`` is None
    when Ray cannot tell.

    Ray's job list holds every driver that is not a job's (status RUNNING while it lives) besides the submitted
    jobs, so drivers the activity API counts while the list shows nothing pending or running belong to jobs that
    have ended (seen a few seconds after 'stop' on a loaded machine: the stopped job listed STOPPED, one driver still
    counted). Those are not activity (the reason says so). When the activity API fails, the job list alone decides."""
    return judge_idle(ray_jobs.activity(url), ray_jobs.list_jobs(url))


def judge_idle(act: dict[str, Any], jobs: list[dict[str, Any]]) -> IdleReport:
    """:func:`idle_report` from what Ray answered: ``act`` (:func:`ray_jobs.activity`) and ``jobs``
    (:func:`ray_jobs.list_jobs`)."""
    now = act.get("observed_at") or time.time()
    busy = [j["job_id"] for j in jobs if j.get("status") in ("PENDING", "RUNNING")]
    if busy:
        why = ", ".join(filter(None, [act.get("reason") if act.get("status") == "ACTIVE" else None,
                                      f"job(s) pending or running: {', '.join(busy)}"]))
        return IdleReport(idle=False, reason=why, busy_jobs=busy)
    notes = []
    if act.get("status") == "ERROR":
        notes.append(f"the dashboard's activity API failed ({act.get('reason')}); judged from the job list, which "
                     "lists drivers too")
    elif act.get("status") == "ACTIVE":
        notes.append(f"Ray still counts driver(s) of ended jobs as active ({act.get('reason')})")
    ends = [j["end_time"] / 1000 for j in jobs if j.get("end_time")]
    marks = [t for t in (act.get("last_activity_at"), act.get("head_started_at"), *ends) if t]
    if not marks:
        return IdleReport(idle=None, reason="Ray reports no job and no head start time")
    since = min(max(marks), now)
    last_job = max([t for t in (act.get("last_activity_at"), *ends) if t], default=None)
    reason = "no job pending or running" + (f"; the last one ended {iso(last_job)}" if last_job else
                                            "; none has run since the head started")
    return IdleReport(idle=True, since=iso(since), idle_seconds=round(now - since, 1), last_job_end=iso(last_job),
                      reason="; ".join([reason, *notes]))


def not_idle_enough(report: IdleReport, need: float) -> str | None:
    """Why ``--if-idle-for`` does not park (None: idle long enough)."""
    if report.idle is None:
        return f"cannot tell whether it is idle ({report.reason})"
    if not report.idle:
        return f"it is busy ({report.reason})"
    if report.idle_seconds < need:
        return f"it has been idle for {report.idle_seconds:.0f}s only (since {report.since}), less than {need:.0f}s"
    return None


def _refuse_under_jobs(cfg: MilesRayConfig, guard: Callable[[], None]) -> None:
    """The guard 'scale' applies before shrinking (a pending or running job of this cluster, or one whose state
    cannot be read), applied to parking (shrinking to 0 GPU nodes), in park's words."""
    try:
        guard()
    except ConfigError as e:
        raise ConfigError(f"refusing to park cluster {cfg.name}: {e.message.split(';')[0]}",
                          hint="stop the run first ('miles-ray stop RUN'), or pass --force") from None


def park_gate(cfg: MilesRayConfig, if_idle_for: float | None, force: bool, idle: Callable[[], IdleReport],
              guard: Callable[[], None]) -> tuple[ParkResult | None, IdleReport | None]:
    """What every backend checks before parking: ``--if-idle-for`` (``idle()`` reports), then, unless --force, the
    running-job ``guard``. Returns (the 'not parked' answer, or None to go on; the idle report, if one was read)."""
    report = None
    if if_idle_for is not None:
        report = idle()
        why = not_idle_enough(report, if_idle_for)
        if why:
            return ParkResult(name=cfg.name, parked=False, reason=f"not parked: {why}", idle=report), report
    if not force:
        _refuse_under_jobs(cfg, guard)
    return None, report
