"""A training run seen from its logs: how far it is (``status RUN``'s ``progress``), what went wrong with it (the
stall and divergence findings of ``status RUN`` and ``doctor RUN``) and its curves (``runs plot``). The logs are
the run's own (every attempt of a supervised run, in order; the saved copy once its cluster is gone), read through
:func:`miles_ray.services.runs.run_logs`; everything computed from them is pure
(:mod:`miles_ray.core.train_progress`)."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from typing import Any, Iterator

from miles_ray.adapters import state
from miles_ray.core.errors import ConfigError, MilesRayError
from miles_ray.core.metrics import eval_metric_names, eval_setup, same_eval
from miles_ray.core.records import RunRecord, as_record
from miles_ray.core.runs import RunStatus
from miles_ray.core.train_progress import (Series, TrainingProgress, findings, key_metrics, num_rollout, parse_series,
                                           progress)
from miles_ray.services.runs import run_logs, run_status


def has_training(record: RunRecord | dict[str, Any]) -> bool:
    """A run whose job prints Miles' metric lines where miles-ray reads them: direct mode (a rehearsal trains
    nothing; the upstream launcher submits a Ray job of its own, which miles-ray does not track)."""
    return as_record(record).mode == "direct"


def _epoch(value: Any) -> float | None:
    """An attempt's ISO ``started`` or a Ray job's ``start_time`` (milliseconds) as epoch seconds."""
    if isinstance(value, (int, float)):
        return value / 1000.0 if value > 1e11 else float(value)
    if isinstance(value, str) and value:
        try:
            return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def read_log(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> str:
    """The run's logs as ``logs RUN`` prints them (every attempt, each after its header; the saved copy once its
    cluster is gone)."""
    return "".join(run_logs(run, False, kube_context=kube_context, kubeconfig=kubeconfig))


def progress_of(info: RunStatus, log_text: str, now: float | None = None,
                series: Series | None = None) -> TrainingProgress:
    """``status RUN``'s ``progress`` for the run ``info`` describes, from its log text (``series``: its metric
    values, when already parsed): the progress (:func:`miles_ray.core.train_progress.progress`), ``metrics`` (key
    metrics) and ``findings``."""
    record = state.load_record(info.run)
    series = parse_series(log_text) if series is None else series
    attempt = info.attempts[-1] if info.attempts else None
    started = _epoch(attempt.started) if attempt is not None else _epoch(info.start_time)
    prog = progress(series, num_rollout(record), time.time() if now is None else now, info.status == "RUNNING",
                    attempt=attempt.attempt if attempt is not None else None, started_at=started)
    return TrainingProgress(**prog, metrics=key_metrics(series), findings=findings(info.run, series, prog, log_text))


def with_progress(info: RunStatus, kube_context: str | None = None, kubeconfig: str | None = None) -> RunStatus:
    """``info`` with its ``progress`` (a training run only; None when its log cannot be read now)."""
    if not has_training(state.load_record(info.run)):
        return info
    try:
        text = read_log(info.run, kube_context, kubeconfig)
    except MilesRayError:
        return info.model_copy(update={"progress": None})
    return info.model_copy(update={"progress": progress_of(info, text)})


def run_training(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> RunStatus:
    """``status RUN`` with the run's ``progress``."""
    return with_progress(run_status(run, kube_context=kube_context, kubeconfig=kubeconfig), kube_context, kubeconfig)


# -- status RUN --watch ------------------------------------------------------------------------------------------

WATCH_SECONDS = 5.0  # status RUN --watch: seconds between two reads of the run (its state and its logs)
LIVE_STATES = ("PENDING", "RUNNING")  # a run in another state has ended (a supervised run between attempts: PENDING)


@dataclass
class Snapshot:
    """One read of a watched run: its status (with ``progress`` for a training run) and its metric values."""

    info: RunStatus
    series: Series


def snapshot(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> Snapshot:
    """The run's status with its progress, and the metric values it was computed from (read once)."""
    info = run_status(run, kube_context=kube_context, kubeconfig=kubeconfig)
    if not has_training(state.load_record(run)):
        return Snapshot(info, Series())
    try:
        text = read_log(run, kube_context, kubeconfig)
    except MilesRayError:
        return Snapshot(info.model_copy(update={"progress": None}), Series())
    series = parse_series(text)
    return Snapshot(info.model_copy(update={"progress": progress_of(info, text, series=series)}), series)


def _pause(seconds: float) -> None:
    """Wait between two reads of a watched run (a test's fake clock replaces it)."""
    time.sleep(seconds)


def watch(run: str, kube_context: str | None = None, kubeconfig: str | None = None,
          interval: float = WATCH_SECONDS) -> Iterator[Snapshot]:
    """``status RUN --watch``: a snapshot of the run now, then one every ``interval`` seconds (counted from the end
    of the read before), the last one that of the run ended. Only reads: nothing of the run is changed, and
    leaving the loop (Ctrl-C) leaves the run as it is."""
    while True:
        snap = snapshot(run, kube_context, kubeconfig)
        yield snap
        if snap.info.status not in LIVE_STATES:
            return
        _pause(interval)


# -- runs plot ----------------------------------------------------------------------------------------------------

@dataclass
class RunCurves:
    """One run to plot: its name and its metric values (with its attempts)."""

    run: str
    series: Series


@dataclass
class Curves:
    """What ``runs plot`` draws: each run's curves, the metrics (panels), and why the runs' eval numbers cannot be
    taken as comparable (``runs compare``'s check, empty when they can)."""

    runs: list[RunCurves]
    metrics: list[str]
    eval_differences: list[str]


DEFAULT_METRICS = ("rollout/raw_reward", "train/loss")


def curves(runs: list[str], metrics: list[str] | None = None, kube_context: str | None = None,
           kubeconfig: str | None = None) -> Curves:
    """The curves of ``runs`` for ``metrics`` (default: the reward, the loss and every eval metric any run logged).
    Bad input (ConfigError, exit 2): a run twice, a run that is not training, a run without a metric line yet,
    a metric no run logged (naming those they did)."""
    if len(set(runs)) != len(runs):
        raise ConfigError(f"runs plot: a run named twice ({', '.join(r for r in runs if runs.count(r) > 1)})")
    records = {r: state.load_record(r) for r in runs}
    got: list[RunCurves] = []
    for run in runs:
        if not has_training(records[run]):
            raise ConfigError(f"runs plot: run {run} is a {as_record(records[run]).mode}-mode run: miles-ray does not "
                              "read metric lines of it")
        series = parse_series(read_log(run, kube_context, kubeconfig))
        if not series.points:
            raise ConfigError(f"runs plot: run {run} has no metric lines yet",
                              hint=f"'miles-ray status {run}' says how it is; 'miles-ray logs {run}' shows its log")
        got.append(RunCurves(run, series))
    have = sorted({n for c in got for n in c.series.names()})
    if metrics:
        missing = [m for m in metrics if m not in have]
        if missing:
            raise ConfigError(f"runs plot: no run logged {', '.join(missing)}; they logged: {', '.join(have)}")
        chosen = list(dict.fromkeys(metrics))
    else:
        evals = eval_metric_names({n: None for n in have})
        chosen = [m for m in DEFAULT_METRICS if m in have] + evals or have[:1]
    reasons: list[str] = []
    first = runs[0]
    for other in runs[1:]:
        reasons += same_eval(eval_setup(records[first]), eval_setup(records[other]), first, other)
    return Curves(got, chosen, reasons)
