"""Run records: the resume rules, a run's head and attempts, and what the run verbs return (the record itself is
:mod:`miles_ray.core.records`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pydantic import Field

from miles_ray.core.errors import ConfigError
from miles_ray.core.records import Attempt as RecordedAttempt
from miles_ray.core.records import RunRecord, as_record, split_key
# the record's own names, importable from here as before (miles_ray.core.records is where they live)
from miles_ray.core.records import RECORDED_ON_CREATION, SCHEMA, CheckpointSource  # noqa: F401
from miles_ray.core.records.upgrade import checkpoints_before_v2
from miles_ray.core.results import Result
from miles_ray.core.train_progress import TrainingProgress

ENDED = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


# -- the head a run's job started on, and its attempts --------------------------------------------------------

def head_identity(node_id: str | None, pod: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The identity of a Ray head: Ray's head node id and, on Kubernetes, its pod (``pod``: NAMESPACE/NAME and
    ``pod_uid``). A head restarted (a new pod, or Ray started again in it) has another."""
    out: dict[str, Any] = {"node_id": node_id}
    if pod:
        out.update(pod=pod.get("pod"), pod_uid=pod.get("pod_uid"))
    return out


def describe_head(head: Mapping[str, Any]) -> str:
    node = f"Ray head node {str(head.get('node_id') or '?')[:16]}"
    return f"head pod {head['pod']} (uid {head.get('pod_uid')}, {node})" if head.get("pod") else node


def head_change(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str | None:
    """Why the head serving now (``now``) is not the one a job started on (``recorded``), or None (the same, or
    nothing recorded to compare: a record older than head identities)."""
    if not recorded:
        return None
    if recorded.get("pod_uid") and now.get("pod_uid") and recorded["pod_uid"] != now["pod_uid"]:
        return f"{describe_head(recorded)} is gone; the head now is {describe_head(now)}"
    if recorded.get("node_id") and recorded["node_id"] != now.get("node_id"):
        return f"{describe_head(recorded)} is gone; the head now is {describe_head(now)}" if now.get("node_id") \
            else f"{describe_head(recorded)} is gone; no head is ALIVE now"
    return None


def current_attempt(record: Mapping[str, Any]) -> dict[str, Any] | None:
    attempts = record.get("attempts") or []
    return attempts[-1] if attempts else None


def lost_attempt(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's current attempt if its job was lost with its head (see :func:`mark_lost`), else None."""
    attempt = current_attempt(record)
    return attempt if attempt and attempt.get("lost") else None


def mark_lost(record: Mapping[str, Any], at: str, why: str, now: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record (as written) with its current attempt ended FAILED: see :meth:`RunRecord.mark_lost`."""
    return as_record(record).mark_lost(at, why, dict(now) if now else None).dump()


def new_attempt(previous: Mapping[str, Any] | None, submission_id: str, started: str, head: Mapping[str, Any],
                resumed_from: str | None) -> list[dict[str, Any]]:
    """The attempts of a run once a new one started (``previous``: the run's record before, None for a new run):
    its number, submission id, start, head and the checkpoint dir it loads from."""
    before = list((previous or {}).get("attempts") or [])
    return [*before, {"attempt": len(before) + 1, "submission_id": submission_id, "started": started,
                      "head": dict(head), "resumed_from": resumed_from}]


def attempt_submission_id(base: str, attempt: int) -> str:
    """The Ray submission id of a run's attempt: the run's own for the first, ``<it>-a<N>`` for attempt N."""
    return base if attempt <= 1 else f"{base}-a{attempt}"


def resume_differences(previous: RunRecord, recipe_hash: str, split: dict[str, Any]) -> list[str]:
    """Why a new run may not reuse ``previous``'s output dir (empty: compatible)."""
    diffs: list[str] = []
    if previous.recipe_hash != recipe_hash:
        diffs.append(f"recipe hash {previous.recipe_hash[:19]} (run {previous.run}, recipe {previous.recipe}) != "
                     f"{recipe_hash[:19]}")
    old, new = previous.split_key(), split_key(split)
    for k in old:
        if old[k] != new[k]:
            diffs.append(f"{k} {old[k]} != {new[k]}")
    return diffs


@dataclass(frozen=True)
class Checkpoints:
    """A run's checkpoint dirs as its record knows them: ``save`` (None: it writes none miles-ray knows of),
    ``load``, ``source`` (a :data:`CheckpointSource`, or ``assumed`` for a record that predates them) and ``note``
    (one line: how it is known)."""

    save: str | None
    load: str | None
    source: str
    note: str


def run_checkpoints(record: RunRecord | Mapping[str, Any]) -> Checkpoints:
    """Where the run of ``record`` saves and loads checkpoints (see :class:`Checkpoints`)."""
    rec = as_record(record)  # a record written before v2 gets them from the upgrade
    if rec.checkpoint_dirs_from is None:  # one of today's schema without them (made by hand): as the upgrade says
        rec = as_record({**rec.dump(), **checkpoints_before_v2(rec.dump())})
    source, save, load, recipe = rec.checkpoint_dirs_from, rec.checkpoint_dir, rec.load_dir, rec.recipe
    if source == "entrypoint":  # a direct-mode job says it itself
        return Checkpoints(save, load, "entrypoint", "recorded before miles-ray kept checkpoint dirs: --save "
                                                     f"{save} read from its train.py command line")
    if source == "assumed":
        return Checkpoints(save, load, "assumed", "recorded before miles-ray kept checkpoint dirs: "
                                                  "<output_dir>/checkpoints assumed")
    if source == "unknown":
        note = ("the upstream launcher decides, and recipe "
                f"{recipe} has no captured flags: miles-ray does not know where it saves")
    elif source == "launcher-capture":
        note = (f"the upstream launcher decides; its captured job for recipe {recipe} saves to "
                f"{save}" if save else f"the upstream launcher decides; its captured job for recipe "
                f"{recipe} passes no --save (Miles writes no checkpoints)")
    else:
        what = "its train.py command line" if source == "job" else \
            "the train.py command line direct mode would run (a rehearsal writes no checkpoints)"
        note = f"--save {save} in {what}" if save else f"{what} passes no --save: Miles writes no checkpoints"
    return Checkpoints(save, load, source, note)


@dataclass(frozen=True)
class ResumeTarget:
    """What a run resumed from another needs: the output dir it writes to and the checkpoint dir it loads from,
    where ``<checkpoint_dir>/latest_checkpointed_iteration.txt`` must be (else Miles starts from scratch)."""

    output_dir: str
    checkpoint_dir: str
    run: str | None = None  # the run resumed from (None: an output dir no record names)


def resume_target(record: RunRecord | Mapping[str, Any]) -> ResumeTarget:
    """Resuming the run of ``record``: its output dir and the dir it saved checkpoints to. Bad input (exit 2) when
    the record knows of no checkpoints it saved."""
    rec = as_record(record)
    ck = run_checkpoints(rec)
    if not ck.save:
        raise ConfigError(f"run {rec.run} has no checkpoint dir to resume from: {ck.note}",
                          hint="resume from a run whose job saves checkpoints (its recipe passes --save, or "
                               "--extra-args gave one)")
    return ResumeTarget(output_dir=str(rec.output_dir), checkpoint_dir=ck.save, run=str(rec.run))


def run_id_of(output_dir: str) -> str:
    """The launcher's --run-id for an output dir: its last component (a resumed run keeps its dirs' name)."""
    return PurePosixPath(output_dir).name


# -- what the run verbs return (typed results: their -o json form is what users parse) ---------------------------

class SavedCopySource(Result):
    """Where and when a run's job was saved (its saved copy)."""

    dir: str
    saved_at: str | None
    reason: str | None


class JobInfo(Result):
    """A job as its head (or its saved copy) describes it (the Ray Jobs API's job info)."""

    job_id: str | None = None
    ray_job_id: str | None = None
    status: str | None = None
    message: str | None = None
    entrypoint: str | None = None
    metadata: dict[str, Any] | None = None
    start_time: int | float | None = None
    end_time: int | float | None = None
    driver_exit_code: int | None = None
    runtime_env: dict[str, Any] | None = None
    submission_id: str | None = None  # in a saved copy
    driver_node_id: str | None = None  # the Ray node its driver runs on (not shown: status compares heads with it)
    saved_copy: SavedCopySource | None = None  # read from the saved copy: where and when it was saved

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> "JobInfo":
        """From the job info dict the Jobs API adapter (or a saved copy) gives; keys it does not know are left out."""
        return cls(**{k: v for k, v in info.items() if k in cls.model_fields})


class RunStatus(Result):
    """status RUN: the run's job state (a Ray job's info, or a Polyaxon job's status), with its record's facts."""

    run: str
    submission_id: str
    address: str
    job_id: str | None = None
    ray_job_id: str | None = None
    status: str | None
    polyaxon_status: str | None = None
    polyaxon_uuid: str | None = None
    message: str | None = None
    entrypoint: str | None = None
    metadata: dict[str, Any] | None = None
    start_time: int | float | None = None
    end_time: int | float | None = None
    driver_exit_code: int | None = None
    saved_copy: SavedCopySource | None = None
    output_dir: str
    recipe: str
    mode: str
    head_lost: "HeadLost | None" = None  # the job was lost with the head it ran on
    attempts: "list[Attempt] | None" = None  # a supervised run's attempts, oldest first
    supervisor: "SupervisorState | None" = None  # a supervised run's supervisor
    # how far its training is (miles_ray.core.train_progress: step, of, eta_seconds, stalled ..., metrics, findings);
    # set by status RUN for a training run (None: its log could not be read)
    progress: TrainingProgress | None = None

    @classmethod
    def of_job(cls, record: RunRecord | Mapping[str, Any], info: JobInfo) -> "RunStatus":
        """A Ray job's status: the job info between the record's identity and its facts."""
        record = as_record(record)
        job = info.model_dump(exclude_unset=True, exclude={"runtime_env", "submission_id", "driver_node_id"})
        if info.saved_copy is not None:
            job["saved_copy"] = info.saved_copy
        return cls(run=record.run, submission_id=record.submission_id, address=record.address, **job,
                   output_dir=record.output_dir, recipe=record.recipe, mode=record.mode)

    @classmethod
    def of_lost(cls, record: RunRecord | Mapping[str, Any],
                attempt: RecordedAttempt | Mapping[str, Any]) -> "RunStatus":
        """A job lost with its head (``attempt``: the record's attempt :meth:`RunRecord.mark_lost` ended):
        FAILED, why."""
        record = as_record(record)
        attempt = RecordedAttempt.model_validate(attempt)
        return cls(run=record.run, submission_id=attempt.submission_id or record.submission_id,
                   address=record.address, status="FAILED", message=attempt.reason,
                   output_dir=record.output_dir, recipe=record.recipe, mode=record.mode,
                   head_lost=HeadLost(attempt=attempt.attempt or 1, at=attempt.ended or "",
                                      reason=attempt.reason or "",
                                      head=attempt.head.model_dump() if attempt.head is not None else None,
                                      serving_head=attempt.serving_head.model_dump()
                                      if attempt.serving_head is not None else None))


class HeadLost(Result):
    """A job lost with its head: when that was found, why, the head it ran on, the head serving then."""

    attempt: int
    at: str
    reason: str
    head: dict[str, Any] | None
    serving_head: dict[str, Any] | None


class Attempt(Result):
    """One attempt of a supervised run, as its supervisor said (``status`` RUNNING until it ended)."""

    attempt: int
    submission_id: str | None
    status: str | None
    started: str | None
    ended: str | None
    reason: str | None
    resumed_from: str | None  # the checkpoint dir it loaded from (None: attempt 1)
    resumed_iteration: int | None  # the iteration latest_checkpointed_iteration.txt named then (None: not seen)
    last_step: int | None  # the last training step in its logs
    retry: bool | None  # once ended: whether another attempt followed
    why: str | None  # why (not) retried

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> "Attempt":
        return cls(**{k: data.get(k) for k in cls.model_fields})


class SupervisorState(Result):
    """A supervised run's supervisor: its kind, restart budget, whether it runs, how it finished."""

    kind: str
    max_restarts: int
    alive: bool | None
    finished: str | None
    reason: str | None
    stopped_at: str | None


RunStatus.model_rebuild()


class Stopped(Result):
    """stop RUN: whether a stop was asked (False: the job had already ended) and the state it ended in (None: not
    waited for)."""

    run: str
    submission_id: str
    stopped: bool
    status: str | None


class RunLogs(Result):
    """logs RUN -o json: the whole logs and the job's state once they ended."""

    run: str
    status: str | None
    logs: str | None


class SavedJob(Result):
    """A job saved from its head: the run, its state, where the copy is."""

    run: str
    status: str | None
    dir: str


class SavedLogs(Result):
    """The driver logs of a saved copy, and where and when they were saved."""

    logs: str
    source: SavedCopySource


class SavedRuns(Result):
    """The runs of a cluster saved before it went away, and why the others were not."""

    saved: list[str] = Field(default_factory=list)
    not_saved: dict[str, str] = Field(default_factory=dict)
    # the runs whose checkpoint listing ('runs outputs') could not be kept, and why (Kubernetes: listed on the cluster)
    outputs_not_saved: dict[str, str] = Field(default_factory=dict)


# -- what submit returns ----------------------------------------------------------------------------------------

class ExistingRunRef(Result):
    submission_id: str | None
    output_dir: str | None


class DryRunView(Result):
    """submit --dry-run: the prepared job in full (entrypoint and runtime env at the top level, as Ray gets them);
    a server dry run adds the live verdict (``problems``) and ``topology``."""

    dry_run: str
    created: bool
    run: str
    kind: str
    submission_id: str
    address: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    output_dir: str
    record: dict[str, Any]
    check_data: bool
    resumed_from: str | None
    warnings: list[str]
    launcher_argv: list[str] | None = None
    operation: dict[str, Any] | None = None
    existing_run: ExistingRunRef | None = None
    problems: list[str] = Field(default_factory=list)
    topology: dict[str, Any] | None = None


class ExistingJob(Result):
    """submit of a run whose job the head still has: that job, not submitted again."""

    run: str
    submission_id: str
    created: bool
    address: str
    status: str | None
    record: str
    output_dir: str
    warnings: list[str] = Field(default_factory=list)


class JobSubmitted(Result):
    """submit: the Ray job submitted (``created``: False when a concurrent submit of the run had made it)."""

    run: str
    submission_id: str
    created: bool
    address: str
    record: str
    output_dir: str
    entrypoint: str
    status: str | None
    miles_version: dict[str, Any] | None = None
    miles_notice: str | None = None
    max_restarts: int | None = None  # a supervised run: its supervisor submits the attempts (None: not supervised)
    warnings: list[str] = Field(default_factory=list)


class LauncherJobCreated(Result):
    """submit --mode launcher on Kubernetes: the launcher created as a Polyaxon job."""

    run: str
    polyaxon_uuid: str
    created: bool
    address: str
    record: str
    output_dir: str
    submission_id: str
    status: str
    launcher_job: bool
    warnings: list[str] = Field(default_factory=list)
    notices: list[str] = Field(default_factory=list)


class LauncherExec(Result):
    """submit --mode launcher on a head reached from here: the upstream launcher is to replace this process
    (its run record is written)."""

    run: str
    record: dict[str, Any]
    address: str
    launcher: bool
    warnings: list[str] = Field(default_factory=list)


class LauncherCommand(Result):
    """How the upstream launcher is run here: its argv, the environment added to this one, its working dir."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
