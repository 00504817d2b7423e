"""Preflight of the queue that admits a cluster (Kueue LocalQueue, Volcano Queue): when the queue's CRD is served,
the queue must exist before anything is created; when it is not, say that nothing will gate the cluster."""

from __future__ import annotations

from miles_ray.adapters import kube
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import NotFound
from miles_ray.core.queues import queue_kind
from miles_ray.core.results import Result

KUEUE = ("kueue.x-k8s.io", "localqueues", "localqueues.kueue.x-k8s.io")
VOLCANO = ("scheduling.volcano.sh", "queues", "queues.scheduling.volcano.sh")
PREFERRED = ("v1", "v1beta2", "v1beta1")


class QueueCheck(Result):
    """The queue that admits the cluster, as the preflight checked it (``checked`` False: its CRD is not served,
    ``note`` says what that means)."""

    kind: str
    queue: str
    checked: bool
    note: str = ""


def _version(served: list[str]) -> str:
    return next((v for v in PREFERRED if v in served), served[0])


def check_queue(cfg: MilesRayConfig, api_client) -> QueueCheck | None:
    """None without a queue; else what was checked. ``NotFound`` when the queue's CRD is served and the queue is
    not there (a Kueue LocalQueue in the cluster's namespace; a Volcano Queue is cluster-scoped)."""
    kind = queue_kind(cfg)
    if kind is None or not cfg.queue:
        return None
    group, plural, crd = KUEUE if kind == "kueue" else VOLCANO
    served = kube.installed_crd_versions(api_client, crd)
    if not served:
        return QueueCheck(kind=kind, queue=cfg.queue, checked=False,
                          note=f"{crd} is not served on this cluster: nothing will hold the cluster back for queue "
                               f"{cfg.queue!r} (is {'Kueue' if kind == 'kueue' else 'Volcano'} installed?)")
    namespace = cfg.namespace if kind == "kueue" else None
    if not kube.custom_object_exists(api_client, group, _version(served), plural, cfg.queue, namespace):
        if kind == "kueue":
            raise NotFound(f"Kueue LocalQueue {cfg.namespace}/{cfg.queue} does not exist",
                           hint=f"'kubectl get localqueues -n {cfg.namespace}' lists the queues; pass one with "
                                "--queue, or ask the cluster admin for a LocalQueue")
        raise NotFound(f"Volcano queue {cfg.queue} does not exist",
                       hint="'kubectl get queues.scheduling.volcano.sh' lists them; pass one with --queue")
    return QueueCheck(kind=kind, queue=cfg.queue, checked=True)
