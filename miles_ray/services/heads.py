"""Which head a verb talks to: the backend choice ('auto' = the local cluster of that name if one exists on
this machine, else Kubernetes) and the head address (``--address``, ``$RAY_ADDRESS``, ``ray_address``, else the
cluster made by ``up``). Reaching the address is :func:`miles_ray.adapters.ray_head.open_head`'s job."""

from __future__ import annotations

import os

from miles_ray.adapters import local_ray, ray_head, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.heads import k8s_address, parse_head, service_url


def local_exists(name: str) -> bool:
    """A local cluster of that name has state on this machine (``up --backend local`` made it)."""
    return local_ray.state_path(state.local_clusters_dir(), name).exists()


def pick_backend(backend: str, cfg: MilesRayConfig) -> str:
    if backend != "auto":
        return backend
    return "local" if local_exists(cfg.name) else "kubernetes"


def kube_raycluster(cfg: MilesRayConfig) -> str:
    """The RayCluster behind the configured cluster name (a Polyaxon operation names it after its run)."""
    return state.read_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)["raycluster"]


def dashboard_address(cfg: MilesRayConfig, backend: str = "auto") -> tuple[str, str]:
    """(backend, head address) of the cluster made by 'up': the local cluster's dashboard URL, or for Kubernetes
    the head service URL from inside the cluster and ``k8s://NAMESPACE/RAYCLUSTER`` from outside (a
    port-forward, see :func:`miles_ray.adapters.ray_head.open_head`)."""
    if pick_backend(backend, cfg) == "local":
        return "local", ray_head.local_dashboard(cfg.name)
    raycluster = kube_raycluster(cfg)
    if ray_head.in_cluster():
        return "kuberay", service_url(cfg.namespace, raycluster)
    return "kuberay", k8s_address(cfg.namespace, raycluster)


def resolve_address(cfg: MilesRayConfig, address: str | None, backend: str = "auto") -> tuple[str, str]:
    """(backend, head address): --address, then $RAY_ADDRESS, then the config's ray_address, then the cluster
    made by up. An explicit address may be a dashboard URL, ``k8s://NAMESPACE/RAYCLUSTER`` or ``local://NAME``
    (resolved here to that cluster's dashboard URL, which is what run records keep)."""
    for candidate, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                              (cfg.ray_address, "ray_address")):
        if candidate:
            head = parse_head(candidate, source)
            if head.kind == "local":
                return "local", ray_head.local_dashboard(head.name or "")
            return ("kuberay" if head.kind == "kubernetes" else "address"), head.address
    return dashboard_address(cfg, backend)
