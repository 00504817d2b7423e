"""Cluster lifecycle across backends: the embedded local Ray cluster and Kubernetes (KubeRay/Polyaxon).

The CLI calls these; they call the adapters. Backend 'auto' means: the local cluster of that name if
one exists on this machine, else Kubernetes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from miles_ray.adapters.state import state_dir
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError

Progress = Callable[[str], None] | None


def local_state_dir() -> Path:
    return state_dir() / "local"


def local_exists(name: str) -> bool:
    from miles_ray.adapters.local_ray import state_path

    return state_path(local_state_dir(), name).exists()


def pick_backend(backend: str, cfg: MilesRayConfig) -> str:
    if backend != "auto":
        return backend
    return "local" if local_exists(cfg.name) else "kubernetes"


def _kube_not_ready() -> ClusterError:
    return ClusterError("the Kubernetes backend is not available in this build",
                        hint="use --backend local for the embedded Ray cluster")


def up(cfg: MilesRayConfig, backend: str, progress: Progress = None, timeout: float = 300, **kube: Any) -> dict:
    if backend == "local":
        from miles_ray.adapters import local_ray

        # Local fake nodes advertise one CPU per GPU plus one spare (Miles's bundles are {GPU:1, CPU:1}).
        return local_ray.up(local_state_dir(), cfg.name, cfg.nodes, cfg.gpus_per_node, cfg.gpus_per_node + 1,
                            progress=progress, timeout=timeout)
    try:
        from miles_ray.services import kube as kube_service
    except ImportError:
        raise _kube_not_ready() from None
    return kube_service.up(cfg, progress=progress, timeout=timeout, **kube)


def status(cfg: MilesRayConfig, backend: str, **kube: Any) -> dict:
    if backend == "local":
        from miles_ray.adapters import local_ray

        return local_ray.status(local_state_dir(), cfg.name)
    try:
        from miles_ray.services import kube as kube_service
    except ImportError:
        raise _kube_not_ready() from None
    return kube_service.status(cfg, **kube)


def scale(cfg: MilesRayConfig, backend: str, nodes: int, progress: Progress = None, timeout: float = 300,
          force: bool = False, **kube: Any) -> dict:
    if backend == "local":
        from miles_ray.adapters import local_ray

        if not force:
            _refuse_shrink_below_running_jobs(cfg, nodes, local_ray.status(local_state_dir(), cfg.name))
        return local_ray.scale(local_state_dir(), cfg.name, nodes, progress=progress, timeout=timeout)
    try:
        from miles_ray.services import kube as kube_service
    except ImportError:
        raise _kube_not_ready() from None
    return kube_service.scale(cfg, nodes, progress=progress, timeout=timeout, force=force, **kube)


def down(cfg: MilesRayConfig, backend: str, **kube: Any) -> dict:
    if backend == "local":
        from miles_ray.adapters import local_ray

        return local_ray.down(local_state_dir(), cfg.name)
    try:
        from miles_ray.services import kube as kube_service
    except ImportError:
        raise _kube_not_ready() from None
    return kube_service.down(cfg, **kube)


def _refuse_shrink_below_running_jobs(cfg: MilesRayConfig, nodes: int, status: dict) -> None:
    """Refuse to remove GPU nodes that a running miles-ray job of this cluster needs (--force overrides)."""
    from miles_ray.adapters import state
    from miles_ray.services.jobs import live_status

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


def dashboard_address(cfg: MilesRayConfig, backend: str = "auto") -> tuple[str, str]:
    """(backend, dashboard URL) of the cluster made by 'up'."""
    chosen = pick_backend(backend, cfg)
    if chosen == "local":
        st = status(cfg, "local")
        return "local", st["dashboard_url"]
    try:
        from miles_ray.services import kube as kube_service
    except ImportError:
        raise ClusterError(
            f"no Ray head address: no local cluster named {cfg.name!r} is running",
            hint="start one with 'miles-ray up --backend local', or pass --address http://HOST:8265 "
                 "(or set RAY_ADDRESS)") from None
    return "kuberay", kube_service.dashboard_address(cfg)
