"""Before and while a RayCluster goes (park, down): whether it is idle, saving its runs' jobs, deleting it."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import kube
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, NotFound
from miles_ray.core.heads import k8s_address, service_url
from miles_ray.services import saved_runs
from miles_ray.services.backends.idle import idle_report
from miles_ray.services.backends.kube.bookkeeping import cluster_record
from miles_ray.services.backends.kube.waits import wait_gone
from miles_ray.services.backends.results import IdleReport, SavedRuns
from miles_ray.services.outputs import keep_listings
from miles_ray.services.runs.supervised import save_supervisor_events


STORAGE_KEPT = "kept (PVCs, connections and checkpoints are never deleted)"


def cluster_idle(cfg: MilesRayConfig) -> IdleReport:
    """:func:`miles_ray.services.lifecycle.idle_report` of the configured cluster, through a port-forward to its
    head."""
    name = cluster_record(cfg)["raycluster"]
    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context,
                   kubeconfig=cfg.kubeconfig) as url:
        return idle_report(url)


def save_runs(cfg: MilesRayConfig) -> SavedRuns:
    """Save the jobs (every attempt's), the supervisor events and the checkpoint listing ('runs outputs') of the runs
    recorded on this cluster (by either address its head is known by)."""
    rc = cluster_record(cfg)["raycluster"]
    head = k8s_address(cfg.namespace, rc)
    records = saved_runs.records_on([head, service_url(cfg.namespace, rc)])
    save_supervisor_events(records)
    saved = saved_runs.save_cluster_runs(records, head, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig)
    keep_listings(records, saved, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig)
    return saved


def delete_raycluster(cfg: MilesRayConfig, api, name: str, out: Any, wait: bool, timeout: float,
                      missing_ok: bool, propagation: str = "Foreground") -> None:
    """Delete the RayCluster ``name`` (``propagation``: see ``RayClusters.delete``) and (``wait``) wait until it and
    its pods are gone; ``out.deleted`` says whether there was one (``out.pods_remaining``: what was left at the
    timeout)."""
    deleted = kube.RayClusters(api).delete(cfg.namespace, name, propagation)
    if not deleted and not missing_ok:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name} to delete")
    out.deleted = deleted
    if wait:
        wait_gone(cfg, api, name, out, timeout)


def idle_or_unknown(cfg: MilesRayConfig) -> IdleReport:
    """:func:`cluster_idle`, or why it cannot be told (the head cannot be reached)."""
    try:
        return cluster_idle(cfg)
    except ClusterError as e:
        return IdleReport(idle=None, reason=str(e).splitlines()[0])
