"""up --single-node: ONE Polyaxon job running the upstream Miles launcher in one pod (it starts Ray inside the pod),
to confirm one complete run before going multi-node. Prepared by the one document pipeline, then created through
the Polyaxon API, idempotent by name and content."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import kube
from miles_ray.core.builders import ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.prepare import Document
from miles_ray.core.progress import Progress, say
from miles_ray.core.results import Result
from miles_ray.services.documents import prepare_documents
from miles_ray.services.backends.polyaxon import polyaxon_preflight, without_kubectl
from miles_ray.services.k8s_clusters import CLIENT_DRY_RUN, check_token_secret, unchecked_token_secret


class SingleNodeUp(Result):
    """What ``up --single-node`` did: validated only (a dry run: the job it would create) or created (its run)."""

    name: str
    kind: str
    project: str
    warnings: list[str]
    notices: list[str]
    dry_run: str | None = None
    created: bool
    operation: dict[str, Any] | None = None
    polyaxon_uuid: str | None = None
    output_dir: str | None = None
    status: str | None = None


def up_single_node(cfg: MilesRayConfig, dry_run: str | None = None, wait: bool = True, timeout: float = 600,
                   progress: Progress = None) -> SingleNodeUp:
    """Prepare and validate the single-node job, check what it needs (the Ray token Secret its container reads, the
    Polyaxon project, the agent's connections), then create it (``dry_run``: only say what would be created;
    ``client``: with nothing checked nor contacted); ``wait``: until it runs."""
    docs = prepare_documents(cfg, (Document.single_node,))
    op = docs.single_node
    project = f"{cfg.polyaxon_owner}/{cfg.polyaxon_project}"
    if dry_run == "client":  # rendered and validated here, nothing contacted: the checks are the server dry run's
        return SingleNodeUp(name=cfg.name, kind="single-node", project=project, warnings=docs.warnings,
                            notices=[CLIENT_DRY_RUN], dry_run=dry_run, created=False, operation=op)
    notices: list[str] = []
    if cfg.ray_auth == "token":  # the job's container reads RAY_AUTH_TOKEN from the Secret (see core.single_node)
        missing = without_kubectl(cfg)
        if missing:
            notices.append(f"no kubeconfig ({missing} does not exist): "
                           f"{unchecked_token_secret(cfg, ray_token_secret(cfg))} is not checked")
        else:
            say(progress, f"preflight: the Ray token Secret {cfg.namespace}/{ray_token_secret(cfg)}")
            check_token_secret(cfg, kube.load_client(cfg.kubeconfig, cfg.kube_context), ray_token_secret(cfg),
                               "the single-node job's container")
    client, known = polyaxon_preflight(cfg, op, progress)
    if dry_run:
        return SingleNodeUp(name=cfg.name, kind="single-node", project=project, warnings=docs.warnings,
                            notices=notices, dry_run=dry_run, created=False, operation=op)
    meta = {"miles_ray": {"recipe": cfg.recipe, "kind": "single-node", "gpus_per_node": cfg.gpus_per_node,
                          "image": docs.image}}
    uuid = client.create_operation(cfg.polyaxon_owner, cfg.polyaxon_project, op, name=cfg.name,
                                   tags=op.get("tags"), meta=meta, known_connections=known)
    say(progress, f"created Polyaxon run {uuid}")
    if wait:
        say(progress, f"waiting up to {timeout:.0f}s for run {uuid} to start (Polyaxon's agent schedules the pod)")
        run = client.wait_for_status(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, {"running", "succeeded"}, timeout)
    else:
        run = client.get_run(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, with_conditions=False)
    return SingleNodeUp(name=cfg.name, kind="single-node", project=project, warnings=docs.warnings, notices=notices,
                        created=True, polyaxon_uuid=uuid, output_dir=f"{cfg.mount_path}/{cfg.runs_dir}/{uuid}",
                        status=run.get("status"))
