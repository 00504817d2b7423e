"""``runs outputs RUN``: a run's checkpoints, each with the attempt that wrote it, the eval metrics logged for it, its
registered version and its fate under the run's retention (rows: :func:`miles_ray.core.outputs.checkpoint_rows`).

Where the checkpoint dir is read: on the local backend, here (its workers share this machine's filesystem, also
after ``down``); on any other cluster, through the probe job ``register`` uses
(:func:`miles_ray.services.registry.list_checkpoints_on_cluster`). Every listing read live is kept in the run's
saved copy (``runs/RUN.saved/outputs.json``); once the cluster cannot be reached (after ``down``) that copy is
shown, marked as last seen (``seen.live`` false, ``seen.at``). The metrics come from the run's logs (every
attempt's, live or saved), the deletions from its supervisor's ``checkpoint_deleted`` events (live or saved), the
registered versions from the run's saved copy (``register`` keeps them there) and the markers in the dirs.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from miles_ray.adapters import checkpoint_files, state
from miles_ray.core.errors import ClusterError, ConfigError, MilesRayError
from miles_ray.core.outputs import CheckpointRow, checkpoint_rows, scores_of
from miles_ray.core.records import RunRecord, as_record
from miles_ray.core.results import Result
from miles_ray.core.runs import SavedRuns
from miles_ray.core.supervision import LIVE, CheckpointScores, Retention, SpecError, final_status, fold_attempts
from miles_ray.services import saved_runs
from miles_ray.services.registry import checkpoint_root, list_checkpoints_local, list_checkpoints_on_cluster
from miles_ray.services.runs import live_status, run_logs
from miles_ray.services.runs.supervised import handle_for


class Seen(Result):
    """Where and when the checkpoint dir was read: ``live`` now, or the copy kept when it was last seen."""

    live: bool
    at: str | None
    where: str


class OutputsResult(Result):
    run: str
    root: str
    seen: Seen
    latest: str | None
    retention: str
    checkpoints: list[CheckpointRow]
    metrics_note: str | None = None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def checkpoints_here(record: RunRecord | dict[str, Any]) -> bool:
    """The run's checkpoint dir is on this machine's filesystem: a run of the local backend (its workers share it),
    or one given a head by an http address on this machine's loopback (the embedded cluster, `--address
    http://127.0.0.1:PORT`) whose checkpoint dir is here (a remote head reached through a hand-made port-forward
    keeps its checkpoints on its own storage: its dir is not here)."""
    rec = as_record(record)
    if rec.backend == "local":
        return True
    address = urlsplit(str(rec.address or ""))
    if rec.backend != "address" or address.scheme not in ("http", "https"):
        return False
    try:
        loopback = address.hostname == "localhost" or ipaddress.ip_address(address.hostname or "").is_loopback
    except ValueError:
        return False
    try:
        return loopback and Path(checkpoint_root(rec.dump())).is_dir()
    except ConfigError:
        return False  # it saves no checkpoints miles-ray knows of: the callers say so


def _listing(record: dict[str, Any], kube_context: str | None, kubeconfig: str | None) -> tuple[dict[str, Any], Seen]:
    """The checkpoint dir now (kept in the saved copy), or as last seen when the cluster cannot be reached."""
    run = as_record(record).run
    try:
        if checkpoints_here(record):
            listing = list_checkpoints_local(checkpoint_root(record), [])
        else:
            listing = list_checkpoints_on_cluster(record, [], kube_context=kube_context, kubeconfig=kubeconfig)
    except ClusterError as e:
        kept = checkpoint_files.last_seen(run)
        if kept is None:
            raise type(e)(f"{e.message}; and no listing of it was kept (none read while the cluster was up)",
                          hint=e.hint, status=e.status) from None
        return kept["listing"], Seen(live=False, at=kept.get("at"), where=f"last seen at {kept.get('at')} "
                                     f"({kept['listing'].get('where')}); now: {e.message.splitlines()[0]}")
    data = listing.to_json()
    at = _now()
    checkpoint_files.save_seen(run, {"at": at, "listing": data})
    return data, Seen(live=True, at=at, where=listing.where)


def keep_listings(records: list[RunRecord] | list[dict[str, Any]], out: SavedRuns, kube_context: str | None = None,
                  kubeconfig: str | None = None) -> None:
    """Before a Kubernetes cluster goes (``down``, ``park``): the checkpoint dir of each of its runs that saves
    checkpoints, listed through the probe job and kept in the run's saved copy -- what ``runs outputs`` shows once the
    cluster cannot be reached, marked as last seen. ``out.outputs_not_saved``: run -> why its listing was not kept
    (after the first that could not be listed on the cluster, the others are not tried: they share its head)."""
    failed: str | None = None
    for typed in records:
        rec = as_record(typed)
        run, record = rec.run, rec.dump()  # the registry's listing reads the record as written
        try:
            checkpoint_root(record)
        except ConfigError:
            continue  # it saves no checkpoints miles-ray knows of
        if failed is not None:
            out.outputs_not_saved[run] = failed
            continue
        try:
            listing = list_checkpoints_on_cluster(record, [], kube_context=kube_context, kubeconfig=kubeconfig)
        except MilesRayError as e:
            out.outputs_not_saved[run] = e.message.splitlines()[0]
            failed = e.message.splitlines()[0] if isinstance(e, ClusterError) else None
            continue
        checkpoint_files.save_seen(run, {"at": _now(), "listing": listing.to_json()})


def _events(record: RunRecord) -> list[dict[str, Any]]:
    """A supervised run's supervisor events (its own, else the copy kept with the run's)."""
    if not record.supervisor:
        return []
    try:
        events = handle_for(record).events()
    except (ClusterError, ConfigError):
        events = []
    if not events:
        saved = state.read_json(state.saved_dir(record.run) / saved_runs.SAVED_EVENTS)
        events = saved if isinstance(saved, list) else []
    return events


def outputs(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> OutputsResult:
    """The outputs of ``run`` (see the module doc)."""
    return outputs_and_scores(run, kube_context, kubeconfig)[0]


def outputs_and_scores(run: str, kube_context: str | None = None,
                       kubeconfig: str | None = None) -> tuple[OutputsResult, CheckpointScores]:
    """:func:`outputs`, and the metrics logged for each checkpoint (every metric, not only the evals)."""
    typed = state.RunStore.load(run)
    record = typed.dump()
    root = checkpoint_root(record)
    listing, seen = _listing(record, kube_context, kubeconfig)
    events = _events(typed)
    recorded = [a.model_dump(mode="json") for a in typed.attempts or []]
    if typed.supervisor:
        attempts = fold_attempts(events) or recorded
        live = seen.live and final_status(events) is None and not typed.supervisor.stopped_at and \
            bool(attempts) and attempts[-1].get("ended") is None
    else:
        attempts = recorded
        live = seen.live and live_status(typed, kube_context, kubeconfig) in LIVE
    chunks: list[str] = []
    note = None
    try:
        for chunk in run_logs(run, False, kube_context=kube_context, kubeconfig=kubeconfig):
            chunks.append(chunk)
    except MilesRayError as e:
        note = f"metrics from part of the logs only: {e.message.splitlines()[0]}" if chunks else \
            f"no metrics: the run's logs could not be read ({e.message.splitlines()[0]})"
    sup = typed.supervisor.model_dump(mode="json") if typed.supervisor else {}
    try:
        policy = Retention.of(sup.get("keep_checkpoints"), sup.get("keep_best"))
    except SpecError:
        policy = Retention()
    scores = scores_of("".join(chunks))
    rows = checkpoint_rows(root, listing, live=live, attempts=attempts, scores=scores,
                           policy=policy, registered=checkpoint_files.registered(run),
                           deleted=[e for e in events if e.get("event") == "checkpoint_deleted"])
    return OutputsResult(run=run, root=root, seen=seen, latest=listing.get("latest"), retention=policy.describe(),
                         checkpoints=rows, **({"metrics_note": note} if note else {})), scores
