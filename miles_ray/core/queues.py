"""Queues and gang scheduling: what a queue or a batch scheduler adds to the objects 'up' creates. Pure.

* Kueue (``queue`` alone): the RayCluster carries ``kueue.x-k8s.io/queue-name``; Kueue's RayCluster integration
  admits the head and every worker group as one workload (gang) and owns ``spec.suspend`` from then on, so
  miles-ray never toggles it ('park' refuses such a cluster). On the Polyaxon path the RayCluster is made by
  Polyaxon's operator, so the pods carry Kueue's pod-group labels instead (one group of head + workers, its
  total count annotated): Kueue admits them together through its pod integration.
* Volcano (``scheduler: volcano``): KubeRay's ``ray.io/scheduler-name: volcano`` label (the operator, started
  with Volcano as its batch scheduler, makes one PodGroup with minMember = head + workers) plus
  ``volcano.sh/queue-name``. On the Polyaxon path the pods name ``schedulerName: volcano`` and the queue.
"""

from __future__ import annotations

import copy
from typing import Any

from miles_ray.core.config import MilesRayConfig

KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
RAY_SCHEDULER = "ray.io/scheduler-name"
VOLCANO_QUEUE = "volcano.sh/queue-name"
VOLCANO_POD_QUEUE = "scheduling.volcano.sh/queue-name"


def queue_kind(cfg: MilesRayConfig) -> str | None:
    """``kueue``, ``volcano`` or None: who admits the cluster."""
    if cfg.scheduler == "volcano":
        return "volcano"
    return "kueue" if cfg.queue else None


def raycluster_labels(cfg: MilesRayConfig) -> dict[str, str]:
    """The labels of the RayCluster object for the configured queue / scheduler."""
    kind = queue_kind(cfg)
    if kind == "kueue":
        return {KUEUE_QUEUE: cfg.queue or ""}
    if kind == "volcano":
        return {RAY_SCHEDULER: "volcano", **({VOLCANO_QUEUE: cfg.queue} if cfg.queue else {})}
    return {}


def apply_to_raycluster(rc: dict[str, Any], cfg: MilesRayConfig) -> dict[str, Any]:
    """A copy of ``rc`` with the queue / scheduler labels on its metadata (never on the pods: Kueue's pod
    integration would then gate each pod again)."""
    extra = raycluster_labels(cfg)
    if not extra:
        return rc
    out = copy.deepcopy(rc)
    out["metadata"]["labels"] = {**out["metadata"].get("labels", {}), **extra}
    return out


def apply_to_operation(op: dict[str, Any], cfg: MilesRayConfig, workers: int) -> dict[str, Any]:
    """A copy of the Polyaxon operation whose head and worker pods carry the queue / scheduler (``workers``: the
    GPU worker replicas, for Kueue's pod-group total count)."""
    kind = queue_kind(cfg)
    if kind is None:
        return op
    out = copy.deepcopy(op)
    run = out["component"]["run"]
    replicas = [run["head"], *run["workers"].values()]
    for rep in replicas:
        env = rep.setdefault("environment", {})
        labels = env.setdefault("labels", {})
        annotations = env.setdefault("annotations", {})
        if kind == "kueue":
            labels.update({KUEUE_QUEUE: cfg.queue, KUEUE_POD_GROUP: cfg.name})
            annotations[KUEUE_POD_GROUP_TOTAL] = str(1 + workers)
        else:
            env["schedulerName"] = "volcano"
            if cfg.queue:
                annotations[VOLCANO_POD_QUEUE] = cfg.queue
        for key in ("labels", "annotations"):
            if not env[key]:
                env.pop(key)
    return out


def kueue_queue_of(rc: dict[str, Any] | None) -> str | None:
    """The Kueue LocalQueue a RayCluster object names (its ``kueue.x-k8s.io/queue-name`` label), else None."""
    return ((rc or {}).get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE)


def kueue_queued(rc: dict[str, Any] | None) -> bool:
    """Whether Kueue holds the RayCluster back: it names a LocalQueue and is suspended (Kueue's webhook suspends
    it at creation; Kueue unsuspends it once the whole gang -- head and every worker -- fits the quota)."""
    return kueue_queue_of(rc) is not None and (rc or {}).get("spec", {}).get("suspend") is True


def kueue_pending_reason(workload: dict[str, Any] | None) -> str:
    """Why Kueue has not admitted a Workload yet, in Kueue's own words (its QuotaReserved / Admitted condition
    message, e.g. 'couldn't assign flavors to pod set ...: insufficient unused quota for nvidia.com/gpu ...')."""
    if workload is None:
        return ("no Kueue Workload for it yet (is Kueue running, with its ray.io/raycluster integration "
                "enabled?)")
    name = workload.get("metadata", {}).get("name", "?")
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    if not (workload.get("spec") or {}).get("active", True):
        return f"its Workload {name} is deactivated (spec.active: false)"
    for kind in ("QuotaReserved", "Admitted"):
        c = conds.get(kind)
        if c and c.get("status") != "True" and c.get("message"):
            return f"Workload {name}: {c['message']}"
    if conds.get("Admitted", {}).get("status") == "True":
        return f"Workload {name} is admitted; Kueue is unsuspending the RayCluster"
    return f"Workload {name} is pending"
