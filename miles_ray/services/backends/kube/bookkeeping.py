"""Where a Kubernetes cluster's bookkeeping lives: which RayCluster (and which backend made it) 'up' recorded on
this machine, and the API client of the configured context."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import kube, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import NotFound


def cluster_record(cfg: MilesRayConfig) -> dict[str, Any]:
    """Which RayCluster the configured name is (and the Polyaxon run behind it), as 'up' recorded it."""
    return state.read_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)


def recorded_via(cfg: MilesRayConfig) -> str:
    """Which Kubernetes backend made the configured cluster, as this machine's bookkeeping says: the record
    'up' wrote; without one, a cluster 'down' took away (only a Polyaxon-made one leaves that), else KubeRay
    (a RayCluster of that name made directly)."""
    rec = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name))
    if rec is not None:
        return rec.get("via") or "kuberay"
    return "polyaxon" if state.read_kube_down(cfg.kube_context, cfg.namespace, cfg.name) is not None else "kuberay"


def save_record(cfg: MilesRayConfig, record: dict[str, Any], token_secret: str) -> None:
    """Also records the cluster's Ray auth, which a later submit (launcher job) must match: the mode and the
    Secret holding the token (``token_secret``: the one the operation references, or KubeRay's)."""
    secret = token_secret if cfg.ray_auth == "token" else None
    state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name,
                             {**record, "ray_auth": cfg.ray_auth, "ray_token_secret": secret})


def client(cfg: MilesRayConfig):
    return kube.load_client(cfg.kubeconfig, cfg.kube_context)


def get_raycluster(api, cfg: MilesRayConfig, name: str) -> dict[str, Any]:
    rc = kube.RayClusters(api).get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    return rc
