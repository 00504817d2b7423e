"""Runs that finish on their own: the supervisor's spec, its events, what an attempt's logs say, and the retention
of checkpoints. Pure, and STANDARD LIBRARY ONLY: the supervisor program (``launchers/supervise.py``) runs where
nothing of ours is installed (a Ray pod, Polyaxon's sidecar image) and imports this module (with ``metrics.py``
and the run controller's modules, miles_ray/controller) shipped beside it (``miles_ray.controller.program``).

The supervisor of a run submits the run's attempts to the Ray head's Jobs API, one at a time: attempt 1 under the
run's submission id, attempt N under ``<it>-a<N>`` (a head that came back keeps the dead job under the old id).
When an attempt fails for a reason worth retrying and the controller's rules say so
(:func:`miles_ray.controller.rules.classify`, :func:`miles_ray.controller.rules.decide`), it waits for the
GPU workers and submits the next attempt, which loads the run's own last complete checkpoint (``--load <the run's
save dir>``: Megatron writes ``latest_checkpointed_iteration.txt`` only once a checkpoint is complete).

It says what it does as events, one JSON object a line on stdout, each line prefixed :data:`EVENT_PREFIX`
(:func:`event_line`, :func:`parse_events`); :func:`fold_attempts` turns them into the run's attempts and
:func:`final_status` into its end.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

# the controller's rules (attempt ids, the restart budget) live in miles_ray.controller.rules: imported (and by
# this module's users from here), never defined twice
try:  # in the miles_ray package
    from miles_ray.controller.rules import (MAX_RESTARTS_LIMIT, SpecError, attempt_of, attempt_submission_id,
                                            check_max_restarts)
    from miles_ray.core.metrics import METRIC_LINE, parse_dict
except ImportError:  # shipped beside launchers/supervise.py
    from metrics import METRIC_LINE, parse_dict  # type: ignore[no-redef]
    from rules import (MAX_RESTARTS_LIMIT, SpecError, attempt_of, attempt_submission_id,  # type: ignore[no-redef]
                       check_max_restarts)


SPEC_SCHEMA = "miles-ray/supervisor-spec/v1"
EVENT_PREFIX = "MILES_RAY_SUPERVISOR "
DEFAULT_MAX_RESTARTS = 3

# the events, in the order an attempt goes through them
EVENTS = ("supervisor_started", "waiting_for_workers", "attempt_started", "attempt_ended", "finished",
          "supervisor_signalled", "checkpoint_deleted")
FINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
LIVE = frozenset({"PENDING", "RUNNING"})


# -- the spec --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobBody:
    """What the Jobs API gets for one attempt (``POST /api/jobs/``) apart from its submission id."""

    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Mapping[str, Any], what: str) -> "JobBody":
        if not isinstance(data, Mapping) or not isinstance(data.get("entrypoint"), str) or not data["entrypoint"]:
            raise SpecError(f"{what}: an object with a non-empty 'entrypoint' is needed")
        return cls(entrypoint=data["entrypoint"], runtime_env=dict(data.get("runtime_env") or {}),
                   metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()})


@dataclass(frozen=True)
class SupervisorSpec:
    """The supervisor's input (``supervise.py --spec FILE``, JSON).

    ``head_url``: the Ray dashboard / Jobs API (``http://HEAD:8265``), as the supervisor reaches it (in a pod: the
    head service). ``token_file``: Ray's token (``Authorization: Bearer``), None when the head needs none.
    ``submission_id``: the run's; attempt N is ``<it>-a<N>``. ``first_job``: attempt 1's body; ``resume_job``: the
    later attempts' (its entrypoint loads the run's own save dir). ``checkpoint_dir``: the run's save dir, read
    (``latest_checkpointed_iteration.txt``) where the supervisor can see it. ``gpu_workers``/``gpus_per_node``: the
    GPU workers to wait for before a retry, up to ``workers_timeout`` seconds. ``polyaxon``: the Polyaxon run to
    report to (read by the reporter plugged in at :func:`launchers.supervise.load_reporter`), None: none.
    ``keep_checkpoints``/``keep_best``: the run's retention (:class:`Retention`; both None: keep everything).
    """

    run: str
    head_url: str
    submission_id: str
    first_job: JobBody
    resume_job: JobBody | None = None
    token_file: str | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    checkpoint_dir: str | None = None
    gpu_workers: int = 0
    gpus_per_node: int = 0
    workers_timeout: float = 600.0
    poll_seconds: float = 2.0
    polyaxon: dict[str, Any] | None = None
    keep_checkpoints: int | None = None
    keep_best: str | None = None
    schema: str = SPEC_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: Any) -> "SupervisorSpec":
        """The spec from its JSON form; :class:`SpecError` names the first thing wrong."""
        if not isinstance(data, Mapping):
            raise SpecError("the spec is not a JSON object")
        if data.get("schema", SPEC_SCHEMA) != SPEC_SCHEMA:
            raise SpecError(f"spec schema {data.get('schema')!r} is not {SPEC_SCHEMA!r}")
        for key in ("run", "head_url", "submission_id"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise SpecError(f"spec field {key!r} must be a non-empty string")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown spec field(s): {', '.join(unknown)}")
        max_restarts = data.get("max_restarts", DEFAULT_MAX_RESTARTS)
        check_max_restarts(max_restarts)
        resume = data.get("resume_job")
        if max_restarts and resume is None:
            raise SpecError("spec field 'resume_job' is needed when max_restarts > 0 (what later attempts run)")
        numbers = {}
        for key, default in (("gpu_workers", 0), ("gpus_per_node", 0), ("workers_timeout", 600.0),
                             ("poll_seconds", 2.0)):
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SpecError(f"spec field {key!r} must be a number >= 0")
            numbers[key] = value
        if numbers["poll_seconds"] <= 0:
            raise SpecError("spec field 'poll_seconds' must be > 0")
        Retention.of(data.get("keep_checkpoints"), data.get("keep_best"))  # (SpecError: the first thing wrong)
        return cls(run=data["run"], head_url=data["head_url"].rstrip("/"), submission_id=data["submission_id"],
                   first_job=JobBody.of(data.get("first_job"), "spec field 'first_job'"),
                   resume_job=JobBody.of(resume, "spec field 'resume_job'") if resume is not None else None,
                   token_file=data.get("token_file") or None, max_restarts=int(max_restarts),
                   checkpoint_dir=data.get("checkpoint_dir") or None, gpu_workers=int(numbers["gpu_workers"]),
                   gpus_per_node=int(numbers["gpus_per_node"]), workers_timeout=float(numbers["workers_timeout"]),
                   poll_seconds=float(numbers["poll_seconds"]), polyaxon=data.get("polyaxon") or None,
                   keep_checkpoints=data.get("keep_checkpoints"), keep_best=data.get("keep_best") or None)


# -- events ----------------------------------------------------------------------------------------------------

def event_line(kind: str, **fields: Any) -> str:
    """One event as the program prints it (one line)."""
    if kind not in EVENTS:
        raise ValueError(f"unknown supervisor event {kind!r}")
    return EVENT_PREFIX + json.dumps({"event": kind, **fields}, sort_keys=True, default=str)


def parse_events(text: str) -> list[dict[str, Any]]:
    """The events in a supervisor's output (other lines, and a line cut off mid-write, are skipped)."""
    out = []
    for line in text.splitlines():
        i = line.find(EVENT_PREFIX)
        if i < 0:
            continue
        try:
            data = json.loads(line[i + len(EVENT_PREFIX):])
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("event") in EVENTS:
            out.append(data)
    return out


ATTEMPT_KEYS = ("attempt", "submission_id", "status", "started", "ended", "reason", "resumed_from",
                "resumed_iteration", "last_step", "retry", "why")


def fold_attempts(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run's attempts, oldest first, from its supervisor's events (a restarted supervisor repeats an
    attempt's start when it adopts it: one attempt per number, the latest facts win). Each has every key of
    :data:`ATTEMPT_KEYS` (None where not known yet); ``status`` is RUNNING from its start until it ended."""
    attempts: dict[int, dict[str, Any]] = {}
    for ev in events:
        n = ev.get("attempt")
        if ev.get("event") not in ("attempt_started", "attempt_ended") or not isinstance(n, int) or n < 1:
            continue
        a = attempts.setdefault(n, {k: None for k in ATTEMPT_KEYS} | {"attempt": n})
        if ev["event"] == "attempt_started":
            if a["ended"] is not None:  # an ended attempt stays ended (a late duplicate start changes nothing)
                continue
            a.update(status="RUNNING", submission_id=ev.get("submission_id"),
                     started=a["started"] or ev.get("started"))
            for k in ("resumed_from", "resumed_iteration"):
                if ev.get(k) is not None:
                    a[k] = ev[k]
        else:
            a.update({k: ev.get(k) for k in ("status", "ended", "reason", "last_step", "retry", "why")})
            a["submission_id"] = ev.get("submission_id") or a["submission_id"]
    return [attempts[n] for n in sorted(attempts)]


def final_status(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The supervisor's ``finished`` event (its last), None while it has not finished."""
    done = [e for e in events if e.get("event") == "finished"]
    return dict(done[-1]) if done else None


# -- what an attempt's logs say --------------------------------------------------------------------------------

def last_step(logs: str | None) -> int | None:
    """The last training step (Miles' ``step N: {...}`` line) in an attempt's logs, None before the first."""
    last = None
    for line in (logs or "").splitlines():
        m = METRIC_LINE.search(line)
        if m and m.group(1) == "step":
            last = int(m.group(2))
    return last


# Miles' numbering of checkpoints (radixark/miles 31f1ca9): train.py loops ``for rollout_id in
# range(args.start_rollout_id, args.num_rollout)`` (0-based) and, after training rollout ``rollout_id``, saves it as
# ``save(rollout_id)`` -> Megatron's ``iter_{rollout_id:07d}`` and ``latest_checkpointed_iteration.txt`` =
# rollout_id; a job that loads iteration N starts at rollout N + 1 (miles/backends/megatron_utils/actor.py:
# ``start_rollout_id = loaded_rollout_id + 1``). So iteration N means rollout N was trained, and iteration 0 is a
# real checkpoint (of rollout 0).

def resume_rollout(iteration: int | None) -> int:
    """The first rollout id of a job that loads checkpoint ``iteration`` (None: none, it starts from rollout 0)."""
    return 0 if iteration is None else iteration + 1


def resumed_at(resumed_from: str | None, iteration: int | None) -> str:
    """Where an attempt resumed, in Miles' numbering: ``DIR iter N, from rollout N+1`` (checkpoint N holds rollout N
    trained; the job that loads it starts at N + 1)."""
    if iteration is None:
        return resumed_from or ""
    return f"{resumed_from} iter {iteration}, from rollout {resume_rollout(iteration)}"


# -- retention: which checkpoints stay ---------------------------------------------------------------------------
#
# ``submit --keep-checkpoints N --keep-best METRIC``: after each new complete checkpoint the run's supervisor deletes
# the complete checkpoints beyond the newest N and the best by METRIC (:func:`retention_plan`). Never deleted: the
# newest complete checkpoint, a checkpoint being written (newer than the tracker while an attempt runs), the one an
# attempt loads from, a registered one (``register`` writes :data:`REGISTERED_MARKER` into its dir: the supervisor
# reads the run's checkpoint dir, not the model registry), anything but an ``iter_*`` dir right inside the run's
# own checkpoint dir. The partial checkpoint a dead attempt left (newer than the tracker when it died, not written
# again since) goes once a newer complete one exists. Neither flag: nothing is ever deleted.

REGISTERED_MARKER = "miles-ray-registered.json"  # in iter_N/: ``register`` made a model version of it
_METRIC_NAME = re.compile(r"(?:(min|max):)?([A-Za-z][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.@-]+)+)")


def parse_keep_best(text: Any) -> tuple[str, str]:
    """``--keep-best METRIC``: (metric, ``max`` | ``min``). ``eval/aime`` (higher is better, the default),
    ``min:eval/loss`` (lower is better); a metric is Miles' ``GROUP/NAME``."""
    m = _METRIC_NAME.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise SpecError(f"--keep-best {text!r} is not a metric: give Miles' GROUP/NAME (eval/aime: the highest is "
                        "kept), or min:GROUP/NAME for a loss (the lowest is kept)")
    return m.group(2), m.group(1) or "max"


@dataclass(frozen=True)
class Retention:
    """A run's retention: ``keep_last`` newest complete checkpoints (None: only the newest, when ``metric`` is
    given) and the best by ``metric`` (``mode`` ``max`` | ``min``). Neither: keep everything."""

    keep_last: int | None = None
    metric: str | None = None
    mode: str = "max"

    @classmethod
    def of(cls, keep_checkpoints: Any = None, keep_best: Any = None) -> "Retention":
        if keep_checkpoints is not None and (isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int)
                                             or keep_checkpoints < 1):
            raise SpecError(f"--keep-checkpoints {keep_checkpoints}: keep at least 1 (the newest complete checkpoint "
                            "is never deleted); leave it out to keep every checkpoint")
        metric, mode = parse_keep_best(keep_best) if keep_best not in (None, "") else (None, "max")
        return cls(keep_last=keep_checkpoints, metric=metric, mode=mode)

    @property
    def active(self) -> bool:
        return self.keep_last is not None or self.metric is not None

    def describe(self) -> str:
        if not self.active:
            return "keep every checkpoint"
        parts = [f"the newest {self.keep_last or 1}"]
        if self.metric:
            parts.append(f"the best by {self.metric} ({'lowest' if self.mode == 'min' else 'highest'})")
        return "keep " + " and ".join(parts)


class CheckpointScores:
    """The metrics logged for each checkpoint (Miles' numbering), read from the attempts' logs as they come
    (:meth:`feed` takes any piece; a line is read once whole). ``step``/``rollout``/``perf N`` lines are rollout N's,
    so checkpoint N's; an ``eval N`` line logged after the attempt's ``step N`` line measured checkpoint N; one
    logged before it -- the eval a job makes at its first rollout S, before training -- measured the checkpoint
    the job loaded: S - 1 (S = 0: the base model, no checkpoint). A later line for the same checkpoint wins."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self._trained: dict[int, set[int]] = {}
        self._rest: dict[int, str] = {}

    def feed(self, attempt: int, text: str, final: bool = False) -> None:
        lines = (self._rest.pop(attempt, "") + (text or "")).split("\n")
        if not final:
            self._rest[attempt] = lines.pop()  # an unfinished line waits for its end
        trained = self._trained.setdefault(attempt, set())
        for line in lines:
            m = METRIC_LINE.search(line)
            if not m:
                continue
            kind, n = m.group(1), int(m.group(2))
            if kind == "step":
                trained.add(n)
            values = parse_dict(m.group(3))
            iteration = n if kind != "eval" or n in trained else n - 1
            if values and iteration >= 0:
                self.metrics.setdefault(iteration, {}).update(values)

    def value(self, iteration: int, metric: str) -> float | None:
        v = self.metrics.get(iteration, {}).get(metric)
        return v if v is not None and math.isfinite(v) else None


def checkpoint_scores(attempt_logs: Iterable[tuple[int, str]]) -> CheckpointScores:
    """The :class:`CheckpointScores` of whole attempt logs ((attempt, text), oldest first)."""
    scores = CheckpointScores()
    for attempt, text in attempt_logs:
        scores.feed(attempt, text, final=True)
    return scores


def best_checkpoint(complete: Iterable[int], scores: CheckpointScores, metric: str, mode: str = "max") -> int | None:
    """The complete checkpoint with the best finite ``metric`` (ties: the newest); None: none has a value."""
    sign = -1.0 if mode == "min" else 1.0
    valued = [(sign * v, it) for it in complete if (v := scores.value(it, metric)) is not None]
    return max(valued)[1] if valued else None


@dataclass(frozen=True)
class Kept:
    """One checkpoint's fate under the retention: kept or not, and why (one phrase)."""

    iteration: int
    keep: bool
    why: str


def retention_plan(policy: Retention, complete: Iterable[int], scores: CheckpointScores | None = None, *,
                   partial: Iterable[int] = (), dead: Iterable[int] = (),
                   protected: Mapping[int, str] | None = None) -> list[Kept]:
    """THE retention rule (see above), oldest first: ``complete`` checkpoints (at or below the tracker), ``partial``
    ones (newer than the tracker, or a dead attempt's), ``dead``: the partial ones a dead attempt left (never
    written again since), ``protected``: iteration -> why it is never deleted (an attempt loads it, registered)."""
    protected = dict(protected or {})
    done = sorted(set(complete))
    newest = done[-1] if done else None
    dead = set(dead)
    out = []
    for it in sorted(set(partial) - set(done)):
        if policy.active and it in dead and newest is not None and newest > it and it not in protected:
            out.append(Kept(it, False, f"a partial checkpoint left by a dead attempt (complete checkpoint {newest} "
                                       "is newer)"))
        else:
            out.append(Kept(it, True, protected.get(it) or ("partial, left by a dead attempt (no newer complete one "
                                                            "yet)" if it in dead else "partial: being written")))
    window = set(done[-(policy.keep_last or 1):]) if done else set()
    best = best_checkpoint(done, scores or CheckpointScores(), policy.metric, policy.mode) if policy.metric else None
    for it in done:
        why = []
        if not policy.active:
            why.append("no retention: every checkpoint is kept")
        if it in protected:
            why.append(protected[it])
        if it == newest:
            why.append("the newest complete checkpoint")
        elif it in window:
            why.append(f"one of the newest {policy.keep_last}")
        if it == best:
            v = (scores or CheckpointScores()).value(it, policy.metric or "")
            why.append(f"the best by {policy.metric} ({v:g})")
        if why:
            out.append(Kept(it, True, "; ".join(why)))
        else:
            out.append(Kept(it, False, f"beyond the newest {policy.keep_last or 1}"
                                       + (f" and not the best by {policy.metric}" if policy.metric else "")))
    return sorted(out, key=lambda k: k.iteration)
