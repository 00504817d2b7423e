"""``runs pull RUN``: one complete checkpoint of a run (the newest complete one, ``--iteration N`` or ``--best
METRIC``) or its eval results, copied to DIR, each file verified against a manifest (size + sha256) computed where
the files are, an interrupted pull resumed without copying its finished files again, a DIR with other content
refused unless ``--force`` (the plan: :func:`miles_ray.core.pull.copy_plan`).

A checkpoint lands as Megatron keeps it, so DIR is a ``--load`` dir: ``DIR/iter_<N:07d>/...`` and
``DIR/latest_checkpointed_iteration.txt`` (N). The eval results are ``DIR/evals.json``: the eval metrics the run
logged for each checkpoint (every attempt's logs; :func:`miles_ray.core.outputs.scores_of`). DIR also gets the
pull's own manifest, ``DIR/.miles-ray-pull.json``.

Where the files are read (:mod:`miles_ray.services.pull_sources`: two transports, one verify/resume path here): a
run on the embedded (local) cluster, from its checkpoint dir here (its workers share this filesystem); a run on a
Kubernetes cluster (KubeRay, or a Polyaxon-made RayCluster), through a short-lived pod that mounts the run's claim
read-only in the cluster's pinned image: it computes each file's size and sha256 on the cluster's side, then streams
the files DIR still needs as a tar; it is deleted at the end (also on an error, Ctrl-C or SIGTERM). ``--evals`` reads
the logs (the Jobs API or the saved copy) on every cluster.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator

from miles_ray.adapters import pull_files, state
from miles_ray.core.errors import ConfigError, Interrupted, TransferFailed
from miles_ray.core.outputs import eval_metrics, scores_of
from miles_ray.core.progress import Progress, say
from miles_ray.core.pull import (TRACKER, ManifestEntry, checked_manifest, choose_checkpoint,
                                 conflict_line, copy_plan, needs_hash)
from miles_ray.core.results import Result
from miles_ray.services.outputs import checkpoints_here, outputs_and_scores
from miles_ray.services.pull_sources import HereSource, Source, kube_head, kube_source
from miles_ray.services.runs import run_logs

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
    seconds: float | None = None  # the whole pull
    copy_seconds: float | None = None  # the copy of the files DIR needed (after the manifest)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _not_here(record: dict[str, Any], root: str | None) -> ConfigError:
    return ConfigError(f"runs pull of a run on the head {record.get('address')} is not available: run "
                       f"{record['run']}'s checkpoints ({root or 'its checkpoint dir'}) are on that cluster's "
                       "storage, not on this machine, and it is not a Kubernetes cluster miles-ray can start a pod "
                       "on; --evals works", hint="copy them from a node that mounts that storage")


@contextlib.contextmanager
def _source(record: dict[str, Any], root: str, prefix: str, kube_context: str | None, kubeconfig: str | None,
            progress: Progress) -> Iterator[Source]:
    """Where the checkpoint's files are read: here, or through a pull pod on the run's Kubernetes cluster."""
    if checkpoints_here(record):
        yield HereSource(root, prefix)
        return
    with kube_source(record, root, prefix, kube_context=kube_context, kubeconfig=kubeconfig,
                     progress=progress) as source:
        yield source


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
    started = time.monotonic()
    record = state.load_record(run)
    if evals and (iteration is not None or best is not None):
        raise ConfigError("--evals pulls the eval results: give it without --iteration / --best")
    if not evals and not checkpoints_here(record) and kube_head(record) is None:
        raise _not_here(record, record.get("checkpoint_dir"))
    problem = pull_files.writable_problem(to)
    if problem:
        raise ConfigError(f"--to {to} cannot be written: {problem}")
    if evals:
        say(progress, f"reading the eval results of run {run} from its logs")
        data, source = _evals(run, kube_context, kubeconfig)
        return _copy(run, to, [_entry(EVALS_FILE, data)], {EVALS_FILE: data}, None, force, meter, on_bytes,
                     progress, started, what="evals", iteration=None,
                     why="the eval metrics logged for each checkpoint", source=source)
    say(progress, f"listing the checkpoints of run {run}")
    listed, scores = outputs_and_scores(run, kube_context, kubeconfig)
    chosen = choose_checkpoint(run, listed.checkpoints, scores, iteration=iteration, best=best)
    row = chosen.row
    prefix = f"iter_{row.iteration:07d}"
    with _source(record, row.path, prefix, kube_context, kubeconfig, progress) as files:
        say(progress, f"checkpoint {row.iteration} ({chosen.why}): computing the sha256 of its files in {files.where}")
        try:
            manifest = files.manifest()
        except OSError as e:
            raise TransferFailed(f"checkpoint {row.iteration} of run {run} cannot be read in {row.path}: {e}") from None
        tracker = str(row.iteration).encode()  # Megatron's tracker: DIR loads as --load DIR
        return _copy(run, to, [*manifest, _entry(TRACKER, tracker)], {TRACKER: tracker}, files, force, meter,
                     on_bytes, progress, started, what="checkpoint", iteration=row.iteration, why=chosen.why,
                     source=files.where)


def _copy(run: str, to: str, manifest: list[ManifestEntry], made: dict[str, bytes], files: Source | None,
          force: bool, meter: Meter, on_bytes: Callable[[int], None] | None, progress: Progress, started: float, *,
          what: str, iteration: int | None, why: str, source: str) -> PullResult:
    """The one verify/resume path of both transports: what DIR needs of ``manifest`` (``made``: files made here, by
    path; the rest come from ``files``), DIR with other content refused without ``force``, each file copied
    verified, the pull's manifest written last."""
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
    done: list[ManifestEntry] = []
    os.makedirs(to, exist_ok=True)
    remote = [e for e in plan.to_copy if e.path not in made]
    copy_started = time.monotonic()

    def kept() -> str:
        return f"{len(done) + len(plan.skip)} of {len(manifest)} file(s) are in {to}, verified"

    def where() -> str:
        left = [e.path for e in plan.to_copy if e not in done]
        return left[0] if left else "the end"

    try:
        if remote:
            assert files is not None
            files.copy(remote, to, on_bytes, done.append)
        for e in plan.to_copy:
            if e.path in made:
                pull_files.copy_verified(made[e.path], to, e, on_bytes)
                done.append(e)
    except KeyboardInterrupt:
        raise Interrupted(f"pull of run {run} interrupted at {where()}: {kept()}",
                          hint="run the same command again: it copies only what is missing") from None
    except OSError as err:
        raise TransferFailed(f"pull of run {run} stopped at {where()}: {err}; {kept()}",
                             hint="run the same command again: it copies only what is missing") from None
    except TransferFailed as err:
        raise TransferFailed(f"{err.message}; {kept()}", hint=err.hint) from None
    copy_seconds = time.monotonic() - copy_started
    content = {"run": run, "what": what, "iteration": iteration, "why": why, "source": source, "pulled_at": _now(),
               "files": [e.to_json() for e in manifest]}
    manifest_path = pull_files.write_manifest(to, content)
    return PullResult(run=run, what=what, iteration=iteration, why=why, source=source,
                      to=os.path.abspath(to), files=len(manifest), bytes=sum(e.bytes for e in manifest),
                      copied_files=len(plan.to_copy), copied_bytes=total, skipped_files=len(plan.skip),
                      skipped_bytes=sum(e.bytes for e in plan.skip), overwritten=plan.differ, left=plan.extra,
                      verified=True, manifest=manifest_path, seconds=round(time.monotonic() - started, 3),
                      copy_seconds=round(copy_seconds, 3))
