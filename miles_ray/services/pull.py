"""``runs pull RUN``: one complete checkpoint of a run (the newest complete one, ``--iteration N`` or ``--best
METRIC``) or its eval results, copied to DIR, each file verified against a manifest (size + sha256) computed where
the files are, an interrupted pull resumed without copying its finished files again, a DIR with other content
refused unless ``--force`` (the plan: :func:`miles_ray.core.pull.copy_plan`).

A checkpoint lands as Megatron keeps it, so DIR is a ``--load`` dir: ``DIR/iter_<N:07d>/...`` and
``DIR/latest_checkpointed_iteration.txt`` (N). The eval results are ``DIR/evals.json``: the eval metrics the run
logged for each checkpoint (every attempt's logs; :func:`miles_ray.core.outputs.scores_of`). DIR also gets the
pull's own manifest, ``DIR/.miles-ray-pull.json``.

Where the files are read: a run on the embedded (local) cluster, from its checkpoint dir here (its workers share
this filesystem). On Kubernetes the checkpoints are on the run's claim: not available
yet (one line, exit 2); ``--evals`` works there (the logs come through the Jobs API or the saved copy).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from typing import Any, Callable

from miles_ray.adapters import pull_files, state
from miles_ray.core.errors import ConfigError, Interrupted, TransferFailed
from miles_ray.core.outputs import eval_metrics, scores_of
from miles_ray.core.progress import Progress, say
from miles_ray.core.pull import (TRACKER, ManifestEntry, checked_manifest, choose_checkpoint,
                                 conflict_line, copy_plan, needs_hash)
from miles_ray.core.results import Result
from miles_ray.services.outputs import checkpoints_here, outputs_and_scores
from miles_ray.services.runs import run_logs, run_namespace

EVALS_FILE = "evals.json"

Meter = Callable[[int, int], None] | None
"""Told the bytes and files to copy (``meter(total_bytes, files)``) before the first; ``on_bytes`` then each chunk."""


class PullResult(Result):
    """What ``runs pull`` brought to ``to``: ``what`` (``checkpoint`` | ``evals``), the checkpoint's ``iteration``
    and ``why`` this one, its ``source``; ``files``/``bytes`` in all, of which ``copied_*`` now and ``skipped_*``
    (already there, same size and sha256); ``overwritten``: files DIR held with other content (--force);
    ``left``: files in DIR that are not part of it (never deleted); ``manifest``: the pull's manifest in DIR."""

    run: str
    what: str
    iteration: int | None
    why: str
    source: str
    to: str
    files: int
    bytes: int
    copied_files: int
    copied_bytes: int
    skipped_files: int
    skipped_bytes: int
    overwritten: list[str]
    left: list[str]
    verified: bool
    manifest: str


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _not_here(record: dict[str, Any], root: str | None) -> ConfigError:
    ns = run_namespace(record)
    what = ("runs pull on Kubernetes is not available yet" if ns else
            f"runs pull of a run on the head {record.get('address')} is not available yet")
    where = f"on the run's claim in namespace {ns}" if ns else "on that cluster's storage"
    return ConfigError(f"{what}: run {record['run']}'s checkpoints ({root or 'its checkpoint dir'}) are {where}, "
                       "not on this machine; --evals works", hint="meanwhile copy them from a pod (or node) that "
                                                                  "mounts that storage")


def _evals(run: str, kube_context: str | None, kubeconfig: str | None) -> tuple[bytes, str]:
    """``evals.json``: the eval metrics the run logged for each checkpoint (every attempt's logs)."""
    text = "".join(run_logs(run, False, kube_context=kube_context, kubeconfig=kubeconfig))
    scores = scores_of(text)
    checkpoints = [{"iteration": it, "metrics": m} for it in sorted(scores.metrics)
                   if (m := eval_metrics(scores, it))]
    if not checkpoints:
        raise ConfigError(f"run {run} logged no eval metrics (no 'eval N: {{...}}' line in its logs): no eval "
                          "results to pull", hint="a run evaluates with --eval-interval and eval data")
    content = {"run": run, "source": "the eval lines of the run's logs, every attempt's (Miles' numbering: "
                                     "iteration N is checkpoint iter_<N:07d>)", "checkpoints": checkpoints}
    return (json.dumps(content, indent=2, sort_keys=True) + "\n").encode(), f"the logs of run {run}"


def _entry(path: str, data: bytes) -> ManifestEntry:
    return ManifestEntry(path=path, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def pull(run: str, to: str, *, iteration: int | None = None, best: str | None = None, evals: bool = False,
         force: bool = False, kube_context: str | None = None, kubeconfig: str | None = None,
         progress: Progress = None, meter: Meter = None, on_bytes: Callable[[int], None] | None = None) -> PullResult:
    """Pull a checkpoint (or with ``evals`` the eval results) of ``run`` into ``to`` (see the module doc). Bad input
    is refused before anything is written: a DIR that cannot be written, no such or a partial checkpoint, a metric
    the run never logged, DIR with other content (without ``force``)."""
    record = state.load_record(run)
    if evals and (iteration is not None or best is not None):
        raise ConfigError("--evals pulls the eval results: give it without --iteration / --best")
    if not evals and not checkpoints_here(record):
        raise _not_here(record, record.get("checkpoint_dir"))
    problem = pull_files.writable_problem(to)
    if problem:
        raise ConfigError(f"--to {to} cannot be written: {problem}")
    sources: dict[str, str | bytes] = {}
    if evals:
        say(progress, f"reading the eval results of run {run} from its logs")
        data, source = _evals(run, kube_context, kubeconfig)
        manifest = [_entry(EVALS_FILE, data)]
        sources[EVALS_FILE] = data
        chosen_it, why = None, "the eval metrics logged for each checkpoint"
    else:
        say(progress, f"listing the checkpoints of run {run}")
        listed, scores = outputs_and_scores(run, kube_context, kubeconfig)
        chosen = choose_checkpoint(run, listed.checkpoints, scores, iteration=iteration, best=best)
        row = chosen.row
        prefix = f"iter_{row.iteration:07d}"
        say(progress, f"checkpoint {row.iteration} ({chosen.why}): computing the sha256 of its files in {row.path}")
        try:
            manifest = pull_files.source_manifest(row.path, prefix)
        except OSError as e:
            raise TransferFailed(f"checkpoint {row.iteration} of run {run} cannot be read in {row.path}: {e}") from None
        for e in manifest:
            sources[e.path] = os.path.join(row.path, *e.path.split("/")[1:])
        tracker = str(row.iteration).encode()  # Megatron's tracker: DIR loads as --load DIR
        manifest.append(_entry(TRACKER, tracker))
        sources[TRACKER] = tracker
        chosen_it, why, source = row.iteration, chosen.why, row.path
    manifest = checked_manifest(manifest)
    sizes = pull_files.sizes_in(to)
    have = {p: (size, None) for p, size in sizes.items()}
    for p in needs_hash(manifest, sizes):
        have[p] = (sizes[p], pull_files.sha256_of(os.path.join(to, *p.split("/"))))
    plan = copy_plan(manifest, have)
    if plan.conflicts and not force:
        raise ConfigError(conflict_line(to, plan), hint="pull into an empty or new dir, or give --force (it "
                                                        "overwrites those files; a file not part of it is kept)")
    total = sum(e.bytes for e in plan.to_copy)
    if meter:
        meter(total, len(plan.to_copy))
    say(progress, f"copying {len(plan.to_copy)} file(s), {total} bytes, to {to}" +
        (f" ({len(plan.skip)} already there, verified)" if plan.skip else ""))
    done = 0
    os.makedirs(to, exist_ok=True)
    for e in plan.to_copy:
        def kept() -> str:
            return f"{done + len(plan.skip)} of {len(manifest)} file(s) are in {to}, verified"

        try:
            pull_files.copy_verified(sources[e.path], to, e, on_bytes)
        except KeyboardInterrupt:
            raise Interrupted(f"pull of run {run} interrupted at {e.path}: {kept()}",
                              hint="run the same command again: it copies only what is missing") from None
        except OSError as err:
            raise TransferFailed(f"pull of run {run} stopped at {e.path}: {err}; {kept()}",
                                 hint="run the same command again: it copies only what is missing") from None
        except TransferFailed as err:
            raise TransferFailed(f"{err.message}; {kept()}", hint=err.hint) from None
        done += 1
    content = {"run": run, "what": "evals" if evals else "checkpoint", "iteration": chosen_it, "why": why,
               "source": source, "pulled_at": _now(), "files": [e.to_json() for e in manifest]}
    where = pull_files.write_manifest(to, content)
    return PullResult(run=run, what=content["what"], iteration=chosen_it, why=why, source=source,
                      to=os.path.abspath(to), files=len(manifest), bytes=sum(e.bytes for e in manifest),
                      copied_files=len(plan.to_copy), copied_bytes=total, skipped_files=len(plan.skip),
                      skipped_bytes=sum(e.bytes for e in plan.skip), overwritten=plan.differ, left=plan.extra,
                      verified=True, manifest=where)

