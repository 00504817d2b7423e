"""One document pipeline: the documents render prints, up creates (through KubeRay or Polyaxon, or the single-node
job) and their dry runs show all come from :func:`prepare_documents` -- the pure prepare step
(:func:`miles_ray.core.prepare.prepare`), then validation with Polyaxon's own schema and the KubeRay CRD's."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from miles_ray.adapters.crd_schema import validate_raycluster
from miles_ray.adapters.polyaxon_spec import to_custom_resource, validate_operation
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.prepare import ClusterDocuments, Document, prepare

# what 'up --via VIA' creates
VIA_DOCUMENTS: dict[str, tuple[Document, ...]] = {"kuberay": (Document.raycluster,),
                                                  "polyaxon": (Document.operation,)}
PREVIEW_RUN_UUID = "0" * 32  # the run uuid of the custom resource render shows (Polyaxon assigns the real one)


def prepare_documents(cfg: MilesRayConfig, kinds: Collection[Document]) -> ClusterDocuments:
    """The documents of ``kinds`` for ``cfg``, each validated: a Polyaxon operation or job by Polyaxon's own check
    and compilation, a RayCluster against the KubeRay v1 CRD schema. ``Document.operation_cr`` also converts the
    operation into the custom resource Polyaxon's agent would create (with a placeholder run uuid)."""
    docs = prepare(cfg, kinds)
    for job in (docs.operation, docs.single_node):
        if job is not None:
            validate_operation(job)
    if Document.operation_cr in kinds:
        docs = replace(docs, polyaxon_cr=_custom_resource(cfg, docs.operation))
    if docs.raycluster is not None:
        validate_raycluster(docs.raycluster)
    return docs


def prepare_cluster(cfg: MilesRayConfig, via: str) -> ClusterDocuments:
    """What ``up --via VIA`` creates (``kuberay``: the RayCluster; ``polyaxon``: the operation), validated."""
    return prepare_documents(cfg, VIA_DOCUMENTS[via])


def _custom_resource(cfg: MilesRayConfig, op: dict) -> dict:
    connections = [{"name": cfg.connection, "kind": "volume_claim",
                    "schema": {"volumeClaim": cfg.claim, "mountPath": cfg.mount_path}}]
    return to_custom_resource(op, namespace=cfg.namespace, run_uuid=PREVIEW_RUN_UUID, run_name=cfg.name,
                              project=cfg.polyaxon_project, owner=cfg.polyaxon_owner, connections=connections,
                              polyaxon_host=cfg.polyaxon_host or "http://localhost:8000")
