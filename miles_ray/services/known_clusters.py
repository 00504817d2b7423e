"""The clusters this machine knows, and the current one (as kubectl has a current context).

``up`` makes the cluster it created the current one (one small JSON file in the state dir); every cluster verb
defaults to it when nothing else names a cluster: ``--name`` (and ``--namespace``/``--context``),
``MILES_RAY_NAME`` and the config file's ``name`` win over it; it wins over the built-in name 'miles'. ``down``
of the current cluster clears it. :func:`list_clusters` lists the local clusters (their state files) and the
Kubernetes ones 'up' recorded, offline unless asked to look (``live``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from miles_ray.adapters import state
from miles_ray.core.config import ENV_PREFIX, MilesRayConfig, find_config_file, load_config
from miles_ray.core.errors import MilesRayError, NotFound
from miles_ray.core.results import Result
from miles_ray.core.safe_yaml import load_yaml_file
from miles_ray.services.backends import for_cluster

CURRENT_FROM = ("[default: the current cluster ('up' sets it; 'miles-ray clusters' lists), else miles; "
                "MILES_RAY_NAME or the config's name win over it]")

# the NotFound errors that mean "no cluster of that name": their hint then names the clusters that do exist
_NO_CLUSTER = re.compile(r"(no local cluster named |no RayCluster |RayCluster \S+ does not exist)")


class CurrentCluster(Result):
    """The current cluster as the state dir keeps it."""

    name: str
    backend: str  # as results call it: local, kuberay or polyaxon
    choice: str  # the --backend choice that means it: local or kubernetes
    on_this_machine: bool
    namespace: str | None = None
    context: str | None = None
    since: str | None = None


class KnownCluster(Result):
    name: str
    backend: str
    namespace: str | None
    context: str | None
    state: str  # running, parked or down
    checked: str  # where the state comes from: 'state file', 'record' (what 'up'/'park' wrote), 'live'
    current: bool


class ClusterList(Result):
    current: str | None
    clusters: list[KnownCluster]


# -- the current cluster ----------------------------------------------------------------------------------


def current() -> CurrentCluster | None:
    """The current cluster, or None (none made yet, taken down, or the file is unreadable)."""
    try:
        rec = state.read_current_cluster()
        return CurrentCluster.model_validate(rec) if rec else None
    except (MilesRayError, ValueError):
        return None


def make_current(cfg: MilesRayConfig, backend_name: str, on_this_machine: bool) -> None:
    """Make the configured cluster, on that backend, the current one."""
    rec: dict[str, Any] = {"name": cfg.name, "backend": backend_name,
                           "choice": "local" if on_this_machine else "kubernetes", "on_this_machine": on_this_machine,
                           "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if not on_this_machine:
        rec.update(namespace=cfg.namespace, context=cfg.kube_context)
    state.write_current_cluster(rec)


def _is_current(cur: CurrentCluster | None, name: str, on_this_machine: bool, namespace: str | None,
                context: str | None) -> bool:
    if cur is None or cur.name != name or cur.on_this_machine != on_this_machine:
        return False
    return on_this_machine or (cur.namespace == namespace and cur.context == context)


def forget(cfg: MilesRayConfig, on_this_machine: bool) -> None:
    """'down' took the configured cluster away: when it was the current one, there is no current one now; the
    copy of a Kubernetes cluster's token 'env' wrote goes."""
    if _is_current(current(), cfg.name, on_this_machine, cfg.namespace, cfg.kube_context):
        state.remove_current_cluster()
    if not on_this_machine:
        state.kube_token_path(cfg.kube_context, cfg.namespace, cfg.name).unlink(missing_ok=True)


def _configured(config_file: str | None, environ: Mapping[str, str]) -> set[str]:
    """The config keys set by ``MILES_RAY_*`` or the config file (an unreadable file: none; loading the
    configuration reports it)."""
    keys = {k[len(ENV_PREFIX):].lower() for k in environ if k.startswith(ENV_PREFIX)}
    path = find_config_file(config_file, environ)
    if path is not None:
        try:
            data = load_yaml_file(path, what="config file")
        except MilesRayError:
            data = None
        if isinstance(data, dict):
            keys |= {str(k) for k in data}
    return keys


def load_with_current(flags: Mapping[str, Any], backend_choice: str, config_file: str | None = None,
                      environ: Mapping[str, str] | None = None) -> MilesRayConfig:
    """The configuration (:func:`miles_ray.core.config.load_config`) of ``flags`` (the verb's, unset ones
    dropped), with the current cluster's name, namespace and context where nothing else names the cluster and
    the backend choice (auto, local, kubernetes) allows it."""
    environ = os.environ if environ is None else environ
    given = dict(flags)
    cur = current() if "name" not in given else None
    configured = _configured(config_file, environ) if cur is not None else set()
    if cur is not None and "name" not in configured and backend_choice in ("auto", cur.choice):
        given["name"] = cur.name
        for key, value in (("namespace", cur.namespace), ("kube_context", cur.context)):
            if value and key not in given and key not in configured:
                given[key] = value
    return load_config(given, config_file, environ)


# -- what this machine knows ---------------------------------------------------------------------------------


def list_clusters(live: bool = False) -> ClusterList:
    """Every cluster this machine knows: local ones from their state files (running or parked), Kubernetes ones
    from the records 'up' wrote (their recorded state; ``live``: asked of the cluster)."""
    cur = current()
    out: list[KnownCluster] = []
    running, parked = state.local_cluster_names()
    for name, st in [(n, "running") for n in running] + [(n, "parked") for n in parked]:
        out.append(KnownCluster(name=name, backend="local", namespace=None, context=None, state=st,
                                checked="state file", current=_is_current(cur, name, True, None, None)))
    for context, rec, down in state.kube_cluster_records():
        name, namespace = rec["name"], rec["namespace"]
        st = "down" if down else ("parked" if rec.get("parked") else "running")
        out.append(KnownCluster(name=name, backend=rec.get("via") or ("polyaxon" if down else "kuberay"), namespace=namespace, context=context,
                                state=st, checked="record",
                                current=_is_current(cur, name, False, namespace, context)))
    if live:
        out = [_live(c) for c in out]
    return ClusterList(current=cur.name if cur else None, clusters=sorted(out, key=lambda c: (not c.current, c.name)))


def _live(c: KnownCluster) -> KnownCluster:
    """The cluster's state as the cluster itself says (local: its processes; Kubernetes: the RayCluster)."""
    if c.state == "down":
        return c
    try:
        cfg = MilesRayConfig(name=c.name, namespace=c.namespace or "default", kube_context=c.context)
        st = for_cluster(cfg, "local" if c.namespace is None else "kubernetes").status(cfg)
        data = st.to_json()
        if data.get("parked") or data.get("state") == "suspended":  # KubeRay's word for a parked RayCluster
            new = "parked"
        elif data.get("down"):
            new = "down"
        else:
            new = "running"
    except NotFound:
        new = "down"
    except MilesRayError as e:
        new = f"unknown ({str(e).splitlines()[0]})"
    return c.model_copy(update={"state": new, "checked": "live"})


def known_line() -> str:
    """One line naming the clusters this machine knows (for an error that names one that does not exist)."""
    try:
        known = list_clusters().clusters
    except MilesRayError:
        return "'miles-ray clusters' lists the clusters this machine knows"
    if not known:
        return "this machine knows no cluster yet: 'miles-ray up --backend local --name NAME' starts one"
    names = ", ".join(f"{c.name} ({c.backend}{', ' + c.namespace if c.namespace else ''}, {c.state}"
                      f"{', current' if c.current else ''})" for c in known)
    return f"clusters this machine knows: {names}; pass --name NAME"


def naming_known(e: MilesRayError) -> MilesRayError:
    """``e`` with the known clusters in its hint when it says a cluster does not exist; else ``e``."""
    if not isinstance(e, NotFound) or not _NO_CLUSTER.search(e.message):
        return e
    e.hint = f"{e.hint}; {known_line()}" if e.hint else known_line()
    return e
