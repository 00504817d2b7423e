"""Clusters on Kubernetes: 'up' through KubeRay or Polyaxon (the backends in
:mod:`miles_ray.services.backends`; what they share is in :mod:`miles_ray.services.backends.kube`, partly
re-exported here).

Each verb first prepares the exact objects it will create (:func:`miles_ray.services.documents.prepare_cluster`:
the one document pipeline, validated), then reads the cluster (preflight) and only then creates or changes anything."""

from __future__ import annotations

from typing import Protocol

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import Interrupted
from miles_ray.core.prepare import ClusterDocuments
from miles_ray.core.progress import Progress
from miles_ray.services.backends.kube.bookkeeping import cluster_record
from miles_ray.services.backends.kube.preflight import (check_fields_known, check_token_secret,
                                                        create_token_secret_hint, preflight, unchecked_token_secret)
from miles_ray.services.backends.kube.waits import wait_ready
from miles_ray.services.backends.results import KubeUp, Preflight
from miles_ray.services.documents import prepare_cluster

# what other modules use from here (they live in backends/kube, shared by the KubeRay and Polyaxon backends)
__all__ = ["CLIENT_DRY_RUN", "check_fields_known", "check_token_secret", "cluster_record", "create_token_secret_hint",
           "preflight", "unchecked_token_secret", "up", "wait_ready"]


class Creates(Protocol):
    """A Kubernetes backend, as 'up' uses it: what it creates (``via``), and creating it once prepared."""

    via: str

    def create(self, cfg: MilesRayConfig, objects: ClusterDocuments, progress: Progress, timeout: float,
               dry_run: str | None, wait: bool, ray_check: bool) -> KubeUp: ...


# -- up -------------------------------------------------------------------------------------------

def up(cfg: MilesRayConfig, backend: Creates, progress: Progress = None, timeout: float = 600,
       dry_run: str | None = None, wait: bool = True, ray_check: bool = True) -> KubeUp:
    try:
        return _up(cfg, backend, progress, timeout, backend.via, dry_run, wait, ray_check)
    except KeyboardInterrupt:
        # Ctrl-C / SIGINT: say what may be left and how to resume (up is idempotent by name)
        raise Interrupted(f"interrupted while bringing up {cfg.name} in {cfg.namespace}; whatever was created is "
                          "left in place", hint="run the same 'miles-ray up' again to resume (it never creates a "
                                                "second cluster), or 'miles-ray down' to remove it") from None


def _up(cfg: MilesRayConfig, backend: Creates, progress: Progress, timeout: float, via: str, dry_run: str | None,
        wait: bool, ray_check: bool) -> KubeUp:
    objects = prepare_cluster(cfg, via)  # everything that will be created, validated, before any I/O
    if dry_run == "client":  # like kubectl --dry-run=client: rendered and validated here, nothing contacted
        return client_dry_run(cfg, via, objects)
    return backend.create(cfg, objects, progress, timeout, dry_run, wait, ray_check)


CLIENT_DRY_RUN = ("client dry run: rendered and validated here, nothing contacted (no Kubernetes, no Polyaxon); "
                  "--dry-run server runs the live checks")


def client_dry_run(cfg: MilesRayConfig, via: str, objects: ClusterDocuments) -> KubeUp:
    """What 'up --via VIA' would create, validated, with no server contacted (the preflight is the server dry
    run's)."""
    result = KubeUp(name=cfg.name, namespace=cfg.namespace, via=via, preflight=Preflight(skipped="client dry run"),
                    warnings=objects.warnings, notices=[CLIENT_DRY_RUN], dry_run="client", created=False)
    if objects.raycluster is not None:
        result.raycluster = objects.raycluster
    if objects.operation is not None:
        result.operation = objects.operation
    return result
