"""How far a training run is, how fast it goes, whether it still moves, and where its key metrics head: from the
metric lines Miles prints (the lines :mod:`miles_ray.core.metrics` parses for ``runs compare``). Pure (no I/O): the
caller hands the log text, the time now and the run's attempts.

(Named ``train_progress``: :mod:`miles_ray.core.progress` is the progress-line callback every layer uses.)

Miles numbers rollouts from 0 (``for rollout_id in range(start_rollout_id, num_rollout)``): after rollout id N,
N + 1 of ``--num-rollout`` rollouts are done. A supervised run's log holds every attempt's lines, each attempt after
a header ``== attempt N (SUBMISSION_ID)[, resumed from ...] ==`` (``logs RUN`` prints the same); a resumed attempt
starts at the rollout after its checkpoint, so what is left (the ETA) is counted from the current attempt's last
rollout, at the current attempt's pace.

Times: each metric line's own timestamp (the logger's ``[2026-01-02 03:04:05,678 ...]`` prefix; Ray adds none).
A timestamp without a zone is the trainer's local time, read in the zone the caller passes (default: this
machine's). A line without one has no time: no pace, no ETA, no stall from it.

The stall rule (:func:`stall_bound`): a running run is **stalled** when no new rollout id appeared for
``STALL_FACTOR`` (5) times its usual step time (the median of its last ``RECENT_STEPS`` step intervals), and never
before ``STALL_FLOOR_SECONDS`` (60 s). Before an attempt has its second rollout there is no usual step time: the
bound is then ``FIRST_STEP_SECONDS`` (30 min: loading the model, starting the engines and the first rollout),
counted from its last rollout or, before the first, from the attempt's start. A stall is told, never acted on.

Divergence (:func:`findings`): a NaN/inf value of any ``train/*loss`` metric, and a reward collapsed to a constant
(its last ``COLLAPSE_WINDOW`` values all equal).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from miles_ray.core.metrics import METRIC_LINE, eval_metric_names, parse_dict
from miles_ray.core.results import Result

STALL_FACTOR = 5
STALL_FLOOR_SECONDS = 60.0
FIRST_STEP_SECONDS = 1800.0
RECENT_STEPS = 10
COLLAPSE_WINDOW = 10
TREND_WINDOW = 5

# the kind of line whose id says how far the run is, best first (one of each per rollout in Miles' loop)
PROGRESS_KINDS = ("rollout", "step", "perf")
REWARD = ("rollout/raw_reward", "rollout/episode_raw_reward")
LOSS = ("train/loss",)
THROUGHPUT = ("perf/tokens_per_gpu_per_sec", "perf/effective_tokens_per_gpu_per_sec", "perf/actor_train_tok_per_s",
              "perf/longest_sample_tokens_per_sec", "perf/rollout_time")

TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6}))?\s?(Z|[+-]\d{2}:?\d{2})?")
ATTEMPT_HEADER = re.compile(r"^== attempt (\d+) \(([^)]*)\)(?:, resumed from (.*))? ==\s*$")
RAY_ACTOR = re.compile(r"\((\w+) pid=(\d+), ip=([\w.:-]+)\)")


@dataclass(frozen=True)
class Point:
    """One metric value: the line kind (eval/rollout/perf/step), its rollout id, the metric, its value, the line's
    time (epoch seconds, None: the line has none) and the attempt whose log held it."""

    kind: str
    step: int
    name: str
    value: float
    at: float | None
    attempt: int


@dataclass(frozen=True)
class AttemptMark:
    """Where an attempt starts in the log: its number, whether it resumed (and from where), and its first rollout."""

    attempt: int
    resumed_from: str | None = None
    first_step: int | None = None


@dataclass
class Series:
    """Every metric value of a run, in log order, and its attempts."""

    points: list[Point] = field(default_factory=list)
    attempts: list[AttemptMark] = field(default_factory=list)
    lines: int = 0
    skipped: int = 0

    def names(self) -> list[str]:
        return sorted({p.name for p in self.points})

    def of(self, name: str) -> list[Point]:
        return [p for p in self.points if p.name == name]


def line_time(text: str, tz: _dt.tzinfo | None = None) -> float | None:
    """Epoch seconds of the first timestamp in ``text`` (a zone-less one read in ``tz``, default: local)."""
    m = TIMESTAMP.search(text)
    if not m:
        return None
    day, clock, frac, zone = m.groups()
    try:
        t = _dt.datetime.fromisoformat(f"{day}T{clock}" + (f".{frac.ljust(6, '0')}" if frac else ""))
    except ValueError:
        return None
    if zone:
        zone = "+00:00" if zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
        t = t.replace(tzinfo=_dt.datetime.fromisoformat(f"2000-01-01T00:00:00{zone}").tzinfo)
    elif tz is not None:
        t = t.replace(tzinfo=tz)
    return t.timestamp()


def parse_series(log_text: str, tz: _dt.tzinfo | None = None) -> Series:
    """Every metric value in a run's log (all attempts), with its line's time and attempt."""
    series = Series()
    attempt = 1
    marks: dict[int, AttemptMark] = {}
    for raw in log_text.splitlines():
        h = ATTEMPT_HEADER.match(raw)
        if h:
            attempt = int(h.group(1))
            marks[attempt] = AttemptMark(attempt, h.group(3))
            continue
        if ": {" not in raw:
            continue
        m = METRIC_LINE.search(raw)
        if not m:
            continue
        values = parse_dict(m.group(3))
        if values is None:
            series.skipped += 1
            continue
        series.lines += 1
        kind, step = m.group(1), int(m.group(2))
        at = line_time(raw[:m.start()], tz)
        mark = marks.setdefault(attempt, AttemptMark(attempt))
        if mark.first_step is None and kind in PROGRESS_KINDS:
            marks[attempt] = AttemptMark(attempt, mark.resumed_from, step)
        series.points.extend(Point(kind, step, name, value, at, attempt) for name, value in values.items())
    series.attempts = [marks[n] for n in sorted(marks)]
    return series


def num_rollout(record: Mapping[str, Any]) -> int | None:
    """The run's ``--num-rollout``: the last one in the entrypoint that ran, else its recipe's."""
    try:
        args = shlex.split(record.get("entrypoint") or "")
    except ValueError:
        args = (record.get("entrypoint") or "").split()
    found = None
    for i, arg in enumerate(args[:-1]):
        if arg == "--num-rollout":
            found = args[i + 1]
    if found is None:
        found = (record.get("recipe_spec") or {}).get("num_rollout")
    try:
        n = int(found) if found is not None else None
    except (TypeError, ValueError):
        return None
    return n if n and n > 0 else None


# -- progress -----------------------------------------------------------------------------------------------------

def _steps(series: Series) -> tuple[str | None, dict[int, list[tuple[int, float | None]]]]:
    """The progress kind and, per attempt, each new rollout id with the time it first appeared."""
    kinds = {p.kind for p in series.points}
    kind = next((k for k in PROGRESS_KINDS if k in kinds), None)
    per: dict[int, list[tuple[int, float | None]]] = {}
    seen: dict[int, set[int]] = {}
    for p in series.points:
        if p.kind != kind or p.step in seen.setdefault(p.attempt, set()):
            continue
        seen[p.attempt].add(p.step)
        per.setdefault(p.attempt, []).append((p.step, p.at))
    return kind, per


def rollouts(series: Series) -> list[tuple[int, int]]:
    """(attempt, rollout id) of every rollout logged, in log order, each once per attempt (a resumed attempt may
    log again a rollout id its predecessor logged before its checkpoint)."""
    _, per = _steps(series)
    return [(n, step) for n in sorted(per) for step, _ in per[n]]


def by_rollout(series: Series, names: Sequence[str]) -> dict[tuple[int, int], dict[str, float]]:
    """The values of ``names`` at each (attempt, rollout id) that logged one of them (the last one of each)."""
    wanted = set(names)
    found: dict[tuple[int, int], dict[str, float]] = {}
    for p in series.points:
        if p.name in wanted:
            found.setdefault((p.attempt, p.step), {})[p.name] = p.value
    return found


def seconds_per_step(per_attempt: Mapping[int, Sequence[tuple[int, float | None]]],
                     recent: int = RECENT_STEPS) -> float | None:
    """The median time of the last ``recent`` step intervals (within an attempt, never across a restart). Log lines
    carry whole seconds: steps faster than that give intervals of 0 and 1 s, whose median (0) says nothing; their
    mean is the pace then."""
    intervals: list[float] = []
    for n in sorted(per_attempt):
        steps = per_attempt[n]
        for (s1, t1), (s2, t2) in zip(steps, steps[1:]):
            if t1 is not None and t2 is not None and s2 > s1 and t2 >= t1:
                intervals.append((t2 - t1) / (s2 - s1))
    if not intervals:
        return None
    recent_intervals = intervals[-recent:]
    return statistics.median(recent_intervals) or statistics.fmean(recent_intervals)


def stall_bound(step_seconds: float | None, factor: float = STALL_FACTOR, floor: float = STALL_FLOOR_SECONDS,
                first: float = FIRST_STEP_SECONDS) -> float:
    """Seconds without a new rollout after which a running run is stalled (module docstring)."""
    if step_seconds is None:
        return max(first, floor)
    return max(factor * step_seconds, floor)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def progress(series: Series, of: int | None, now: float, running: bool, attempt: int | None = None,
             started_at: float | None = None) -> dict[str, Any]:
    """The run's progress: ``step`` (the last rollout id, 0-based), ``of`` (``--num-rollout``), ``fraction`` done,
    ``seconds_per_step`` (recent median), ``eta_seconds``, ``last_step_at``, ``stalled`` and
    ``stalled_for_seconds`` (+ ``attempt`` and ``stall_after_seconds``, the bound in force). ``attempt``: the
    run's current attempt (default: the last in the log); ``started_at``: when it started (epoch), for a stall
    before its first rollout. Not ``running``: no ETA and never stalled."""
    _, per = _steps(series)
    current = attempt if attempt is not None else max([m.attempt for m in series.attempts] + list(per) + [1])
    mine = per.get(current) or []
    everything = [s for n in sorted(per) for s in per[n]]
    last = mine[-1] if mine else (everything[-1] if everything else None)
    step = last[0] if last else None
    sps = seconds_per_step(per)
    done = (step + 1) if step is not None else 0
    fraction = min(done / of, 1.0) if of else None
    eta = None
    if running and of and sps is not None:
        left = max(of - done, 0)
        # rounded up to a tenth of a second: rollouts left never read as an ETA of 0 (0 means done)
        eta = max(math.ceil(left * sps * 10) / 10, 0.1) if left else 0.0
    last_at = last[1] if last else None
    bound = stall_bound(sps if len(mine) >= 2 else None)
    since = mine[-1][1] if mine else started_at
    stalled, stalled_for = False, None
    if running and since is not None and done < (of or math.inf):
        quiet = max(now - since, 0.0)
        if quiet > bound:
            stalled, stalled_for = True, round(quiet, 1)
    return {"step": step, "of": of, "fraction": None if fraction is None else round(fraction, 4),
            "seconds_per_step": None if sps is None else round(sps, 3),
            "eta_seconds": eta, "last_step_at": _iso(last_at),
            "stalled": stalled, "stalled_for_seconds": stalled_for, "attempt": current,
            "stall_after_seconds": round(bound, 1)}


class TrainingProgress(Result):
    """``status RUN``'s ``progress``: :func:`progress`'s keys, the :func:`key_metrics` (``metrics``) and the
    :func:`findings`."""

    step: int | None
    of: int | None
    fraction: float | None
    seconds_per_step: float | None
    eta_seconds: float | None
    last_step_at: str | None
    stalled: bool
    stalled_for_seconds: float | None
    attempt: int
    stall_after_seconds: float
    metrics: dict[str, dict[str, Any] | None]
    findings: list[dict[str, Any]]


# -- key metrics ----------------------------------------------------------------------------------------------------

def trend(values: Sequence[float], window: int = TREND_WINDOW) -> str | None:
    """``up``/``down``/``flat``: the mean of the last ``window`` finite values against the ``window`` before them
    (fewer when there are fewer; flat within 1%); None with fewer than two values."""
    vals = [v for v in values if math.isfinite(v)]
    n = min(window, len(vals) // 2)
    if n < 1:
        return None
    before, recent = statistics.fmean(vals[-2 * n:-n]), statistics.fmean(vals[-n:])
    scale = max(abs(before), abs(recent), 1e-12)
    if abs(recent - before) <= 0.01 * scale:
        return "flat"
    return "up" if recent > before else "down"


def _pick(names: Sequence[str], have: set[str]) -> str | None:
    return next((n for n in names if n in have), None)


def key_metrics(series: Series) -> dict[str, dict[str, Any] | None]:
    """The last value and trend of the reward, the loss, the (first) eval metric and the throughput (from the perf
    lines): ``{key: {"metric", "value", "step", "trend"} | None}``; a non-finite value is a string (strict JSON)."""
    have = set(series.names())
    chosen = {"reward": _pick(REWARD, have), "loss": _pick(LOSS, have),
              "eval": (eval_metric_names({n: None for n in have}) or [None])[0], "throughput": _pick(THROUGHPUT, have)}
    out: dict[str, dict[str, Any] | None] = {}
    for key, name in chosen.items():
        pts = series.of(name) if name else []
        if not pts:
            out[key] = None
            continue
        value = pts[-1].value
        out[key] = {"metric": name, "value": value if math.isfinite(value) else str(value), "step": pts[-1].step,
                    "trend": trend([p.value for p in pts])}
    return out


# -- findings -------------------------------------------------------------------------------------------------------

def quiet_actors(log_text: str, limit: int = 3) -> list[str]:
    """The Ray actors (``(Name pid=N, ip=A)`` prefixes) that went quiet first: those whose last line is the
    earliest, each with that line (where the logs tell which node went quiet)."""
    last: dict[tuple[str, str, str], tuple[int, str]] = {}
    lines = log_text.splitlines()
    for i, raw in enumerate(lines):
        m = RAY_ACTOR.search(raw)
        if m:
            last[m.groups()] = (i, raw.strip())
    if len(last) < 2:
        return []
    ordered = sorted(last.items(), key=lambda kv: kv[1][0])
    return [f"{name} pid={pid} on {ip}: quiet for its last {len(lines) - 1 - i} log line(s), last said: {text[:160]}"
            for (name, pid, ip), (i, text) in ordered[:limit]]


def findings(run: str, series: Series, prog: Mapping[str, Any], log_text: str = "") -> list[dict[str, Any]]:
    """Stall, NaN/inf loss, collapsed reward: ``{"check", "summary", "evidence", "next"}`` each (what to look at
    next in ``next``)."""
    found: list[dict[str, Any]] = []
    if prog.get("stalled"):
        where = (f"after rollout {prog['step']}" if prog.get("step") is not None
                 else f"attempt {prog.get('attempt')} has logged no rollout yet")
        evidence = [f"last rollout at {prog.get('last_step_at') or '-'}; usual step time "
                    f"{prog.get('seconds_per_step') or '-'} s; stalled after {prog.get('stall_after_seconds')} s "
                    f"({STALL_FACTOR} x the usual step time, at least {STALL_FLOOR_SECONDS:g} s; "
                    f"{FIRST_STEP_SECONDS:g} s before a second rollout)"] + quiet_actors(log_text)
        found.append({"check": "stall",
                      "summary": f"run {run} has logged no new rollout for {prog['stalled_for_seconds']:.0f}s "
                                 f"({where})",
                      "evidence": evidence,
                      "next": f"'miles-ray doctor {run}' (nodes, GPUs, the head); 'miles-ray logs {run}' (the last "
                              "lines of each actor: a hung NCCL collective prints nothing); the run is not stopped"})
    losses = sorted({p.name for p in series.points if p.name.startswith("train/") and p.name.endswith("loss")})
    for name in losses:
        bad = [p for p in series.of(name) if not math.isfinite(p.value)]
        if bad:
            found.append({"check": "nan_loss",
                          "summary": f"run {run}: {name} is {bad[-1].value} at rollout {bad[-1].step}",
                          "evidence": [f"{len(bad)} non-finite value(s) of {name}, first at rollout {bad[0].step}"],
                          "next": f"'miles-ray logs {run}' around rollout {bad[0].step} (grad_norm, the learning "
                                  "rate, the data of that batch); resume from a checkpoint before it with a lower "
                                  "learning rate"})
    reward = _pick(REWARD, set(series.names()))
    values = [p.value for p in series.of(reward)] if reward else []
    tail = values[-COLLAPSE_WINDOW:]
    if len(tail) == COLLAPSE_WINDOW and all(math.isfinite(v) for v in tail) and max(tail) == min(tail):
        found.append({"check": "reward_collapse",
                      "summary": f"run {run}: {reward} has been {tail[-1]:g} for its last {COLLAPSE_WINDOW} "
                                 "rollouts (collapsed to a constant)",
                      "evidence": [f"{reward} at rollouts {series.of(reward)[-COLLAPSE_WINDOW].step}.."
                                   f"{series.of(reward)[-1].step}: all {tail[-1]:g}"],
                      "next": f"'miles-ray logs {run}': the rollout samples and rollout/response_len (empty or "
                              "truncated answers), the reward function and its key"})
    return found
