"""The cluster backends behind one seam: the embedded local Ray cluster (:mod:`.local`), KubeRay directly
(:mod:`.kuberay`) and KubeRay through Polyaxon (:mod:`.polyaxon`); what the two Kubernetes ones share is in the
package :mod:`.kube` (one module a topic). Every cluster verb asks :func:`for_cluster` which backend a cluster is on,
then calls it: each method returns one typed result (:mod:`.results`)."""

from __future__ import annotations

from typing import Protocol

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.progress import Progress
from miles_ray.services.backends.kube.bookkeeping import recorded_via
from miles_ray.services.backends.kuberay import KubeRayBackend
from miles_ray.services.backends.local import LocalBackend
from miles_ray.services.backends.polyaxon import PolyaxonBackend
from miles_ray.services.backends.results import (ClusterStatus, DownResult, ParkResult, ResumeResult, ScaleResult,
                                                 UpResult)
from miles_ray.services.heads import local_chosen


class ClusterBackend(Protocol):
    """What every backend does to a cluster. ``name`` is the backend as results and messages call it;
    ``on_this_machine``: only local processes are involved (nothing to confirm, and 'up' always waits)."""

    name: str
    on_this_machine: bool

    def up(self, cfg: MilesRayConfig, *, progress: Progress = None, timeout: float = 600, dry_run: str | None = None,
           wait: bool = True, ray_check: bool = True) -> UpResult: ...

    def status(self, cfg: MilesRayConfig, *, with_ray: bool = False) -> ClusterStatus: ...

    def refuse_scale(self, cfg: MilesRayConfig) -> None:
        """Refuse, before anything starts, a cluster whose size something else owns (KubeRay's autoscaler)."""

    def scale(self, cfg: MilesRayConfig, nodes: int, *, progress: Progress = None, timeout: float = 300,
              force: bool = False, wait: bool = True, ray_check: bool = True) -> ScaleResult: ...

    def park(self, cfg: MilesRayConfig, *, force: bool = False, if_idle_for: float | None = None, wait: bool = True,
             timeout: float = 300, progress: Progress = None) -> ParkResult: ...

    def resume(self, cfg: MilesRayConfig, *, wait: bool = True, ray_check: bool = True, timeout: float = 600,
               progress: Progress = None) -> ResumeResult: ...

    def down(self, cfg: MilesRayConfig) -> DownResult: ...


LOCAL = LocalBackend()
KUBERNETES: dict[str, ClusterBackend] = {"kuberay": KubeRayBackend(), "polyaxon": PolyaxonBackend()}


def for_cluster(cfg: MilesRayConfig, backend_choice: str = "auto", via: str | None = None) -> ClusterBackend:
    """The backend of the configured cluster. ``backend_choice`` 'auto': the local cluster of that name if this
    machine has one (running or parked), else Kubernetes. On Kubernetes, ``via`` (for 'up': kuberay or
    polyaxon) decides; without it, the cluster's record says which made it."""
    if local_chosen(backend_choice, cfg):
        return LOCAL
    return KUBERNETES[via or recorded_via(cfg)]
