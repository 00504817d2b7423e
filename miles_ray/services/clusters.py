"""The cluster verbs' service: which backend a cluster is on (:func:`backend_for`, the one dispatch of
:mod:`miles_ray.services.backends`), and each verb's call on it, returning one typed result."""

from __future__ import annotations

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
from miles_ray.core.prepare import resolve_plan
from miles_ray.core.planner import summary_line
from miles_ray.core.progress import Progress
from miles_ray.services.backends import ClusterBackend, for_cluster
from miles_ray.services.backends.results import (ClusterStatus, DownResult, ParkResult, ResumeResult, ScaleResult,
                                                 UpResult)
from miles_ray.services.heads import local_exists, pick_backend
from miles_ray.services.known_clusters import forget, make_current

# the backend choice is part of this service's surface (the verbs pick a backend before they call it)
__all__ = ["backend_for", "down", "scale_backend", "up_backend", "local_exists", "park", "pick_backend", "resume", "scale", "status", "up"]


def backend_for(cfg: MilesRayConfig, backend_choice: str = "auto", via: str | None = None) -> ClusterBackend:
    """The backend of the configured cluster (``backend_choice``: auto, local or kubernetes; ``via`` for 'up')."""
    return for_cluster(cfg, backend_choice, via)


def up_backend(cfg: MilesRayConfig, backend_choice: str, via: str, dry_run: str | None = None) -> ClusterBackend:
    """The backend 'up' creates the cluster on: the local cluster of that name if this machine has one ('auto'),
    else Kubernetes, where ``via`` decides. A dry run is the Kubernetes API server's: refused locally."""
    backend = for_cluster(cfg, backend_choice, via)
    if dry_run and backend.on_this_machine:
        raise ConfigError("--dry-run applies to --backend kubernetes", hint="'miles-ray plan' checks a split")
    return backend


def up(cfg: MilesRayConfig, backend: ClusterBackend, *, progress: Progress = None, timeout: float = 600,
       dry_run: str | None = None, wait: bool = True, ray_check: bool = True) -> UpResult:
    """Create the cluster and (``wait``) wait until every GPU worker has joined Ray; idempotent by name. The
    cluster becomes the current one (every cluster verb's default, :mod:`miles_ray.services.known_clusters`)."""
    result = backend.up(cfg, progress=progress, timeout=timeout, dry_run=dry_run, wait=wait, ray_check=ray_check)
    if not dry_run:
        make_current(cfg, backend.name, backend.on_this_machine)
    return result


def status(cfg: MilesRayConfig, backend: ClusterBackend, *, with_ray: bool = False) -> ClusterStatus:
    """The cluster's nodes and GPUs and since when it is idle, or that it is parked (or taken down)."""
    return backend.status(cfg, with_ray=with_ray)


def scale_backend(cfg: MilesRayConfig, backend_choice: str) -> ClusterBackend:
    """The backend 'scale' resizes the cluster on, once it is clear that nothing else owns the cluster's size
    (KubeRay's in-tree autoscaler would undo a manual one)."""
    backend = for_cluster(cfg, backend_choice)
    backend.refuse_scale(cfg)
    return backend


def scale(cfg: MilesRayConfig, backend: ClusterBackend, nodes: int, *, progress: Progress = None,
          timeout: float = 300, force: bool = False, wait: bool = True, ray_check: bool = True) -> ScaleResult:
    """Resize the GPU worker group; for a size above 0 the result also carries the split recommended for the new
    size, for the cluster as it was made (its workers' GPUs, not the configured default)."""
    result = backend.scale(cfg, nodes, progress=progress, timeout=timeout, force=force, wait=wait,
                           ray_check=ray_check)
    if nodes > 0:
        gpn = result.gpus_each or cfg.gpus_per_node
        _, plan = resolve_plan(cfg.model_copy(update={"nodes": nodes, "gpus_per_node": gpn}))
        result.recommended_split = plan.model_dump(mode="json", include={"feasible", "layout", "miles_args", "errors"})
        result.split_summary = summary_line(plan)
    return result


def park(cfg: MilesRayConfig, backend: ClusterBackend, *, force: bool = False, if_idle_for: float | None = None,
         wait: bool = True, timeout: float = 300, progress: Progress = None) -> ParkResult:
    """Free the cluster's GPUs and keep everything needed to bring it back with 'resume'. Refuses under a
    running job unless ``force``; with ``if_idle_for`` (seconds) parks only a cluster idle at least that long
    (``parked`` False says why not). The driver logs of the runs on it are saved first (their Ray job info
    goes with the pods)."""
    return backend.park(cfg, force=force, if_idle_for=if_idle_for, wait=wait, timeout=timeout, progress=progress)


def resume(cfg: MilesRayConfig, backend: ClusterBackend, *, wait: bool = True, ray_check: bool = True,
           timeout: float = 600, progress: Progress = None) -> ResumeResult:
    """Bring a parked cluster back and (``wait``) wait until every GPU worker has rejoined Ray, as 'up' does.
    A cluster that is not parked is only waited for."""
    return backend.resume(cfg, wait=wait, ray_check=ray_check, timeout=timeout, progress=progress)


def down(cfg: MilesRayConfig, backend: ClusterBackend) -> DownResult:
    """Delete the cluster, first saving the driver logs and job info of every run recorded on it
    (:mod:`miles_ray.services.saved_runs`); ``saved_runs`` in the result says which were saved. When it was
    the current cluster, there is no current cluster afterwards."""
    result = backend.down(cfg)
    forget(cfg, backend.on_this_machine)
    return result
