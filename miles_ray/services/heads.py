"""Which head a verb talks to: the backend choice ('auto' = the local cluster of that name if this machine has
one, running or parked, else Kubernetes; :func:`miles_ray.services.backends.for_cluster` dispatches on it) and
the head address (``--address``, ``$RAY_ADDRESS``, ``ray_address``, else the cluster made by ``up``).
Reaching the address is :func:`miles_ray.adapters.ray_head.open_head`'s job."""

from __future__ import annotations

import os
from typing import Callable

from miles_ray.adapters import local_ray, ray_head, state
from miles_ray.core.builders import token_secret_of
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.heads import HeadAddress, k8s_address, parse_head, service_url

# what resolve_address answers for an explicit head address, by its kind: (backend, address); a local cluster by
# name is its dashboard URL, which run records keep
BY_KIND: dict[str, Callable[[HeadAddress], tuple[str, str]]] = {
    "local": lambda head: ("local", ray_head.local_dashboard(head.name or "")),
    "kubernetes": lambda head: ("kuberay", head.address),
    "url": lambda head: ("address", head.address),
}


def local_exists(name: str) -> bool:
    """A local cluster of that name has state on this machine (``up --backend local`` made it)."""
    return local_ray.state_path(state.local_clusters_dir(), name).exists()


def local_chosen(backend: str, cfg: MilesRayConfig) -> bool:
    """Whether the backend choice (``--backend``: auto, local or kubernetes) means the local cluster: 'auto'
    does when this machine has a local cluster of that name, running or parked."""
    if backend != "auto":
        return backend == "local"
    return local_exists(cfg.name) or state.read_parked_local(cfg.name) is not None


def pick_backend(backend: str, cfg: MilesRayConfig) -> str:
    """The backend choice resolved: 'local' or 'kubernetes' (:func:`miles_ray.services.backends.for_cluster`
    says which Kubernetes backend)."""
    return "local" if local_chosen(backend, cfg) else "kubernetes"


def kube_raycluster(cfg: MilesRayConfig) -> str:
    """The RayCluster behind the configured cluster name (a Polyaxon operation names it after its run)."""
    return state.read_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)["raycluster"]


def dashboard_address(cfg: MilesRayConfig, backend: str = "auto") -> tuple[str, str]:
    """(backend, head address) of the cluster made by 'up': the local cluster's dashboard URL, or for Kubernetes
    the head service URL from inside the cluster and ``k8s://NAMESPACE/RAYCLUSTER`` from outside (a
    port-forward, see :func:`miles_ray.adapters.ray_head.open_head`)."""
    if local_chosen(backend, cfg):
        return "local", ray_head.local_dashboard(cfg.name)
    raycluster = kube_raycluster(cfg)
    if ray_head.in_cluster():
        return "kuberay", service_url(cfg.namespace, raycluster)
    return "kuberay", k8s_address(cfg.namespace, raycluster)


def resolve_address(cfg: MilesRayConfig, address: str | None, backend: str = "auto") -> tuple[str, str]:
    """(backend, head address): --address, then $RAY_API_SERVER_ADDRESS, then $RAY_ADDRESS, then the config's ray_address, then the cluster
    made by up. An explicit address may be a dashboard URL, ``k8s://NAMESPACE/RAYCLUSTER`` or ``local://NAME``
    (resolved here to that cluster's dashboard URL, which is what run records keep)."""
    # RAY_API_SERVER_ADDRESS first, as Ray's job CLI reads it ('miles-ray env' sets it to the dashboard URL and
    # RAY_ADDRESS to the GCS address that 'ray status' needs)
    for candidate, source in ((address, "--address"),
                              (os.environ.get("RAY_API_SERVER_ADDRESS"), "RAY_API_SERVER_ADDRESS"),
                              (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                              (cfg.ray_address, "ray_address")):
        if candidate:
            head = parse_head(candidate, source)
            return BY_KIND[head.kind](head)
    return dashboard_address(cfg, backend)


def recorded_head_auth(cfg: MilesRayConfig, address: str) -> tuple[str, str | None] | None:
    """The Ray auth of the KubeRay head at ``address`` as this machine's bookkeeping knows it, without reading the
    cluster: (mode, the Secret holding its token). From the record 'up' wrote for that RayCluster (whatever
    --name the submit names); without one, a ``plx-operation-<uuid>`` RayCluster is taken as Polyaxon-made (its
    token Secret is the one the operation references) and any other as KubeRay's (the Secret named after it).
    None for a head that is not on Kubernetes."""
    head = parse_head(address)
    if head.namespace is None:  # only the address of a RayCluster's head names a namespace
        return None
    rec = state.find_kube_cluster(cfg.kube_context, head.namespace or "", head.name or "") or {}
    via = rec.get("via") or ("polyaxon" if (head.name or "").startswith("plx-operation-") else "kuberay")
    if (rec.get("ray_auth") or cfg.ray_auth) != "token":
        return "disabled", None
    return "token", token_secret_of(cfg, head.name or "", via, rec.get("ray_token_secret"))
