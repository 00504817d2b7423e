"""A run's outputs (``runs outputs RUN``): its checkpoints paired with the attempt that wrote them, the metrics logged
for them, their registered versions and their fate under the run's retention. Pure (no I/O): the listing of the
checkpoint dir, the attempts, the logs, the supervisor's ``checkpoint_deleted`` events come in, rows go out.

Miles' numbering (:mod:`miles_ray.core.supervision`): checkpoint N holds rollout N trained; Megatron writes
``latest_checkpointed_iteration.txt`` (the tracker) last, so a checkpoint is complete when its iteration is at or
below the tracker and its files are there; a dir newer than the tracker is being written (an attempt runs) or was
left by an attempt that ended before finishing it. The metrics of checkpoint N come from
:class:`miles_ray.core.supervision.CheckpointScores` (the eval a job makes at its first rollout S, before training,
measured checkpoint S - 1).
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Iterable, Mapping

from miles_ray.core.results import Result
from miles_ray.core.supervision import (CheckpointScores, Retention, SpecError, best_checkpoint, checkpoint_scores,
                                         parse_keep_best, retention_plan)

_HEADER = re.compile(r"^== attempt (\d+) \(.*==\s*$", re.M)


class CheckpointRow(Result):
    """One checkpoint of a run (``-o json``'s ``checkpoints``). ``state``: ``complete`` | ``partial`` | ``deleted``
    (pruned by the run's retention); ``why``: why it is partial, kept or was deleted; ``written``: its newest
    file's time (ISO, UTC); ``attempt``: the attempt that wrote it (None: not known); ``metrics``: the eval metrics
    logged for it; ``registered``: the model version(s) made of it."""

    iteration: int
    complete: bool
    state: str
    bytes: int | None
    path: str
    written: str | None
    attempt: int | None
    metrics: dict[str, float]
    registered: list[str]
    kept: bool
    why: str


def split_attempts(log_text: str) -> list[tuple[int, str]]:
    """A run's logs as ``logs RUN`` prints them, cut at each attempt's header (``== attempt N (...) ==``): (attempt,
    its text), oldest first; a log without headers is attempt 1's."""
    heads = list(_HEADER.finditer(log_text or ""))
    if not heads:
        return [(1, log_text or "")]
    out = [(int(m.group(1)), log_text[m.end():(heads[i + 1].start() if i + 1 < len(heads) else len(log_text))])
           for i, m in enumerate(heads)]
    return out


def scores_of(log_text: str) -> CheckpointScores:
    """The metrics logged for each checkpoint in a run's logs (every attempt's, :func:`split_attempts`)."""
    return checkpoint_scores(split_attempts(log_text))


def writer(iteration: int, attempts: Iterable[Mapping[str, Any]]) -> int | None:
    """The attempt that wrote checkpoint ``iteration``: the latest attempt that started at or before rollout
    ``iteration`` (attempt N starts at its ``resumed_iteration`` + 1; one that loaded nothing at rollout 0)."""
    found = None
    for a in sorted(attempts, key=lambda a: a.get("attempt") or 0):
        n = a.get("attempt")
        if not isinstance(n, int):
            continue
        loaded = a.get("resumed_iteration")
        start = loaded + 1 if isinstance(loaded, int) and n > 1 else 0
        if start <= iteration:
            found = n
    return found


def latest_of(text: str | None) -> int | None:
    t = (text or "").strip()
    return 0 if t == "release" else int(t) if t.isdigit() else None


def _iso(epoch: Any) -> str | None:
    if not isinstance(epoch, (int, float)) or epoch <= 0:
        return None
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).isoformat(timespec="seconds")


def eval_metrics(scores: CheckpointScores, iteration: int) -> dict[str, float]:
    return {k: v for k, v in sorted((scores.metrics.get(iteration) or {}).items()) if k.startswith("eval/")}


def checkpoint_rows(root: str, listing: Mapping[str, Any], *, live: bool, attempts: list[Mapping[str, Any]],
                    scores: CheckpointScores, policy: Retention, registered: Iterable[Mapping[str, Any]] = (),
                    deleted: Iterable[Mapping[str, Any]] = ()) -> list[CheckpointRow]:
    """Every checkpoint of a run, oldest first: those in ``listing`` (``iterations``, ``latest``: the tracker's
    text, ``details``: per str(iteration) bytes, mtime, registered marker, missing) and those its supervisor deleted
    (``deleted``: ``checkpoint_deleted`` events). ``live``: an attempt runs now (a dir newer than the tracker is
    being written); ``registered``: the versions ``register`` made (``iteration``, ``version``)."""
    latest = latest_of(listing.get("latest"))
    details = listing.get("details") or {}
    versions: dict[int, list[str]] = {}
    for entry in registered:
        if isinstance(entry.get("iteration"), int) and entry.get("version"):
            versions.setdefault(entry["iteration"], []).append(str(entry["version"]))
    iterations = sorted(set(listing.get("iterations") or []))
    for it in iterations:
        marker = (details.get(str(it)) or {}).get("registered") or {}
        if marker.get("version") and marker["version"] not in versions.get(it, []):
            versions.setdefault(it, []).append(str(marker["version"]))
    partial: dict[int, str] = {}
    for it in iterations:
        missing = (details.get(str(it)) or {}).get("missing")
        if latest is None or it > latest:
            tracker = "no tracker yet" if latest is None else f"newer than the tracker ({latest})"
            partial[it] = f"partial: {tracker}, " + ("being written" if live else
                                                      "left by an attempt that ended before finishing it")
        elif missing:
            partial[it] = f"partial: {missing}"
    complete = [it for it in iterations if it not in partial]
    protected = {it: f"registered ({', '.join(v)})" for it, v in versions.items()}
    # the checkpoint the last attempt loaded: its supervisor never deleted it, while it ran nor after (its last pruning
    # was that attempt's)
    current = attempts[-1] if attempts else None
    if current is not None and isinstance(current.get("resumed_iteration"), int):
        protected.setdefault(current["resumed_iteration"], f"attempt {current.get('attempt')} loaded it")
    plan = {k.iteration: k for k in retention_plan(policy, complete, scores, partial=partial,
                                                   dead=() if live else partial, protected=protected)}
    rows = []
    for it in iterations:
        d = details.get(str(it)) or {}
        verdict = plan[it]
        due = "" if verdict.keep else f"the retention would delete it: {verdict.why}"
        if it in partial:
            why = partial[it] + (f"; {due}" if due else "")
        else:
            why = f"on disk; {due}" if due else verdict.why
        rows.append(CheckpointRow(iteration=it, complete=it not in partial, state="partial" if it in partial
                                  else "complete", bytes=d.get("bytes"), path=f"{root.rstrip('/')}/iter_{it:07d}",
                                  written=_iso(d.get("mtime")), attempt=writer(it, attempts),
                                  metrics=eval_metrics(scores, it), registered=versions.get(it, []), kept=True,
                                  why=why))
    on_disk = set(iterations)
    for ev in deleted:
        it = ev.get("iteration")
        if not isinstance(it, int) or it in on_disk:
            continue  # (written again since it was deleted: the row above)
        on_disk.add(it)
        was_partial = str(ev.get("why") or "").startswith("a partial")
        rows.append(CheckpointRow(iteration=it, complete=not was_partial, state="deleted", bytes=ev.get("bytes"),
                                  path=str(ev.get("path") or f"{root.rstrip('/')}/iter_{it:07d}"), written=None,
                                  attempt=writer(it, attempts), metrics=eval_metrics(scores, it),
                                  registered=versions.get(it, []), kept=False,
                                  why=f"deleted by the retention at {ev.get('at')}: {ev.get('why')}"))
    return sorted(rows, key=lambda r: r.iteration)


def complete_iterations(listing: Mapping[str, Any]) -> list[int]:
    """The complete checkpoints of a listing (at or below the tracker, nothing known missing), oldest first: the
    rule of :func:`checkpoint_rows`."""
    latest = latest_of(listing.get("latest"))
    details = listing.get("details") or {}
    return sorted(it for it in set(listing.get("iterations") or []) if latest is not None and it <= latest
                  and not (details.get(str(it)) or {}).get("missing"))


def headline_eval(scores: CheckpointScores) -> str | None:
    """The eval metric a run is judged by when none is named: its first ``eval/<dataset>`` (not a sub-metric such as
    ``eval/aime-truncated_ratio``), by name."""
    names = sorted({k for m in scores.metrics.values() for k in m
                    if k.startswith("eval/") and "-" not in k.split("/", 1)[1]})
    return names[0] if names else None


class CheckpointSummary(Result):
    """``runs compare``'s ``checkpoints``: a run's newest complete checkpoint and its best by ``metric`` (the run's
    --keep-best, else its first eval metric; ``value``), as its saved outputs listing (``seen_at``) has them."""

    newest: int | None
    best: int | None
    metric: str | None
    value: float | None
    seen_at: str | None
    note: str


def checkpoint_summary(run: str, seen: Mapping[str, Any] | None, scores: CheckpointScores,
                       keep_best: str | None = None) -> CheckpointSummary:
    """The newest and best complete checkpoint of ``run`` in ``seen`` (the saved listing: ``at``, ``listing``; None:
    none saved) with the metrics of ``scores``."""
    if not seen or not isinstance(seen.get("listing"), Mapping):
        return CheckpointSummary(newest=None, best=None, metric=None, value=None, seen_at=None,
                                 note=f"no outputs listing saved: 'miles-ray runs outputs {run}' reads one")
    complete = complete_iterations(seen["listing"])
    metric, mode = (None, "max")
    if keep_best:
        try:
            metric, mode = parse_keep_best(keep_best)
        except SpecError:
            metric = None
    metric = metric or headline_eval(scores)
    best = best_checkpoint(complete, scores, metric, mode) if metric else None
    at = seen.get("at")
    if not complete:
        note = f"no complete checkpoint (outputs listing of {at})"
    elif best is None:
        note = (f"{metric} logged for no complete checkpoint" if metric else "no eval metric logged") + \
            f" (outputs listing of {at})"
    else:
        note = f"best by {metric} ({'lowest' if mode == 'min' else 'highest'}); outputs listing of {at}"
    return CheckpointSummary(newest=complete[-1] if complete else None, best=best, metric=metric,
                             value=scores.value(best, metric) if best is not None and metric else None,
                             seen_at=at if isinstance(at, str) else None, note=note)
