"""Clusters on Kubernetes: 'up' through KubeRay or Polyaxon (the backends in
:mod:`miles_ray.services.backends`; what they share is in :mod:`miles_ray.services.backends.kube_common`,
re-exported here); and the single-node Polyaxon job.

Each verb first prepares, purely, the exact objects it will create (:func:`miles_ray.core.plans.prepare_cluster`,
validated), then reads the cluster (preflight) and only then creates or changes anything."""

from __future__ import annotations

from typing import Any, Protocol

from miles_ray.adapters import polyaxon_spec
from miles_ray.core.builders import ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import Interrupted
from miles_ray.core.plans import ClusterObjects, prepare_cluster
from miles_ray.core.progress import Progress, say as _say
from miles_ray.services.backends.kube_common import (check_fields_known, check_token_secret, client as _client,
                                                     cluster_record, create_token_secret_hint, polyaxon_preflight,
                                                     preflight, unchecked_token_secret, wait_ready, without_kubectl)
from miles_ray.services.backends.results import KubeUp

# what other modules use from here (they live in kube_common, shared by the KubeRay and Polyaxon backends)
__all__ = ["check_fields_known", "check_token_secret", "cluster_record", "create_token_secret_hint",
           "polyaxon_preflight", "preflight", "unchecked_token_secret", "up", "up_single_node", "wait_ready",
           "without_kubectl"]


class Creates(Protocol):
    """A Kubernetes backend, as 'up' uses it: what it creates (``via``), and creating it once prepared."""

    via: str

    def create(self, cfg: MilesRayConfig, objects: ClusterObjects, progress: Progress, timeout: float,
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
    objects = prepare_cluster(cfg, via)  # everything that will be created, before any I/O
    if objects.operation is not None:
        polyaxon_spec.validate_operation(objects.operation)
    return backend.create(cfg, objects, progress, timeout, dry_run, wait, ray_check)


def up_single_node(cfg: MilesRayConfig, op: dict, warnings: list[str], dry_run: str | None, wait: bool,
                   timeout: float, progress: Progress = None) -> dict[str, Any]:
    """Create the single-node job (one pod running the upstream launcher, to confirm one complete run before
    going multi-node; built and validated by the caller) through the Polyaxon API, idempotent by name and
    content."""
    notices: list[str] = []
    if cfg.ray_auth == "token":  # the job's container reads RAY_AUTH_TOKEN from the Secret (see single_node)
        missing = without_kubectl(cfg)
        if missing:
            notices.append(f"no kubeconfig ({missing} does not exist): "
                           f"{unchecked_token_secret(cfg, ray_token_secret(cfg))} is not checked")
        else:
            _say(progress, f"preflight: the Ray token Secret {cfg.namespace}/{ray_token_secret(cfg)}")
            check_token_secret(cfg, _client(cfg), ray_token_secret(cfg), "the single-node job's container")
    client, known = polyaxon_preflight(cfg, op, progress)
    result: dict[str, Any] = {"name": cfg.name, "kind": "single-node",
                              "project": f"{cfg.polyaxon_owner}/{cfg.polyaxon_project}", "warnings": warnings,
                              "notices": notices}
    if dry_run:
        result.update({"dry_run": dry_run, "created": False, "operation": op})
        return result
    meta = {"miles_ray": {"recipe": cfg.recipe, "kind": "single-node", "gpus_per_node": cfg.gpus_per_node,
                          "image": cfg.image}}
    uuid = client.create_operation(cfg.polyaxon_owner, cfg.polyaxon_project, op, name=cfg.name,
                                   tags=op.get("tags"), meta=meta, known_connections=known)
    _say(progress, f"created Polyaxon run {uuid}")
    result.update({"created": True, "polyaxon_uuid": uuid,
                   "output_dir": f"{cfg.mount_path}/{cfg.runs_dir}/{uuid}"})
    if wait:
        _say(progress, f"waiting up to {timeout:.0f}s for run {uuid} to start (Polyaxon's agent schedules the pod)")
        run = client.wait_for_status(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, {"running", "succeeded"}, timeout)
    else:
        run = client.get_run(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, with_conditions=False)
    result["status"] = run.get("status")
    return result
