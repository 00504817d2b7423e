"""Cluster lifecycle across backends: the embedded local Ray cluster and Kubernetes (KubeRay/Polyaxon).

The CLI calls these; they call the adapters (local) or :mod:`miles_ray.services.k8s_clusters` (Kubernetes).
Backend 'auto' means: the local cluster of that name if one exists on this machine, else Kubernetes
(:func:`miles_ray.services.heads.pick_backend`).
"""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import local_ray, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.heads import LOCAL_SCHEME, k8s_address, service_url
from miles_ray.services import k8s_clusters, saved_runs
from miles_ray.services.heads import local_exists, pick_backend
from miles_ray.services.jobs import live_status
from miles_ray.core.progress import Progress


# the backend choice is part of this service's surface (the verbs pick a backend before they call it)
__all__ = ["down", "local_exists", "pick_backend", "scale", "status", "up"]


def up(cfg: MilesRayConfig, backend: str, progress: Progress = None, timeout: float = 300, **kube: Any) -> dict:
    if backend == "local":
        # Local fake nodes advertise one CPU per GPU plus one spare (Miles's bundles are {GPU:1, CPU:1}).
        return local_ray.up(state.local_clusters_dir(), cfg.name, cfg.nodes, cfg.gpus_per_node,
                            cfg.gpus_per_node + 1, progress=progress, timeout=timeout, auth=cfg.ray_auth)
    return k8s_clusters.up(cfg, progress=progress, timeout=timeout, **kube)


def status(cfg: MilesRayConfig, backend: str, **kube: Any) -> dict:
    if backend == "local":
        return local_ray.status(state.local_clusters_dir(), cfg.name)
    return k8s_clusters.status(cfg, **kube)


def scale(cfg: MilesRayConfig, backend: str, nodes: int, progress: Progress = None, timeout: float = 300,
          force: bool = False, **kube: Any) -> dict:
    if backend == "local":
        if not force:
            refuse_shrink_below_running_jobs(cfg, nodes, local_ray.status(state.local_clusters_dir(), cfg.name))
        return local_ray.scale(state.local_clusters_dir(), cfg.name, nodes, progress=progress, timeout=timeout)
    return k8s_clusters.scale(cfg, nodes, progress=progress, timeout=timeout, force=force, **kube)


def down(cfg: MilesRayConfig, backend: str, **kube: Any) -> dict:
    """Delete the cluster, first saving the driver logs and job info of every run recorded on it
    (:mod:`miles_ray.services.saved_runs`); ``saved_runs`` in the result says which were saved."""
    if backend == "local" and state.read_parked_local(cfg.name) is not None and not local_exists(cfg.name):
        state.remove_parked_local(cfg.name)  # parked: its processes are already gone
        return {"name": cfg.name, "was_parked": True, "saved_runs": {"saved": [], "not_saved": {}}}
    saved = save_runs_before_down(cfg, backend)
    if backend == "local":
        out = local_ray.down(state.local_clusters_dir(), cfg.name)
    else:
        out = k8s_clusters.down(cfg, **kube)
    return {**out, "saved_runs": saved}


def save_runs_before_down(cfg: MilesRayConfig, backend: str) -> dict:
    """Save the jobs of the runs recorded on this cluster (by any of the addresses its head is known by)."""
    if backend == "local":
        head = f"{LOCAL_SCHEME}{cfg.name}"
        addresses = [head]
        try:
            addresses.append(local_ray.status(state.local_clusters_dir(), cfg.name)["dashboard_url"])
        except ClusterError:
            pass
    else:
        rc = k8s_clusters.cluster_record(cfg)["raycluster"]
        head = k8s_address(cfg.namespace, rc)
        addresses = [head, service_url(cfg.namespace, rc)]
    return saved_runs.save_cluster_runs(saved_runs.records_on(addresses), head, kube_context=cfg.kube_context,
                                        kubeconfig=cfg.kubeconfig).to_json()


def refuse_shrink_below_running_jobs(cfg: MilesRayConfig, nodes: int, status: dict) -> None:
    """Refuse to remove GPU nodes that a running miles-ray job of this cluster needs (--force overrides)."""
    current = status.get("gpu_node_count", 0)
    if nodes >= current:
        return
    for rec in state.list_records():
        if rec.get("cluster") != cfg.name or rec.get("address") != status.get("dashboard_url"):
            continue
        need = int(rec.get("split", {}).get("nodes", 0))
        if need > nodes and live_status(rec) in {"PENDING", "RUNNING"}:
            raise ConfigError(
                f"run {rec['run']!r} is {live_status(rec)} and needs {need} GPU nodes; scaling to {nodes} would "
                "take GPUs from under it", hint="stop the run first, or pass --force")
