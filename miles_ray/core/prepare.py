"""The one "prepare" step of every verb that creates or prints a cluster's documents (render, up through KubeRay
or Polyaxon and their dry runs, up --single-node): configuration -> pinned image -> plan -> the exact documents.
Pure: nothing here reads a cluster or writes anything. The documents are validated (by the adapters that know
Polyaxon's and KubeRay's schemas) in :func:`miles_ray.services.documents.prepare_documents`, the only caller."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from miles_ray.core.builders import build_operation, build_raycluster
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError, PlanError
from miles_ray.core.images import check_image
from miles_ray.core.memory import check_pod_fit
from miles_ray.core.planner import Plan, plan_split, summary_line
from miles_ray.core.queues import apply_to_operation, apply_to_raycluster
from miles_ray.core.recipes import Recipe, get_recipe
from miles_ray.core.single_node import build_single_node


class Document(str, Enum):
    """A document the pipeline builds. The value is its name for ``render -F`` and in render's file names; the
    members are in the order render prints and writes them."""

    operation = "polyaxon"  # the Polyaxon operation (run.kind raycluster) 'up --via polyaxon' creates
    operation_cr = "polyaxon-cr"  # the Kubernetes custom resource Polyaxon's agent would make of that operation
    raycluster = "kuberay"  # the KubeRay ray.io/v1 RayCluster 'up --via kuberay' creates
    single_node = "single-node"  # the single-node Polyaxon job 'up --single-node' creates


def resolve_plan(cfg: MilesRayConfig) -> tuple[Recipe, Plan]:
    """Config -> (recipe, plan). Shared by plan, render, up, scale and submit."""
    recipe = get_recipe(cfg.recipe, cfg.recipe_file)
    plan = plan_split(recipe, cfg.nodes, cfg.gpus_per_node, cfg.layout, cfg.rollout_nodes, cfg.rollout_gpus)
    return recipe, plan


def require_feasible(plan: Plan) -> None:
    """PlanError (exit 2) naming every violated rule when the split is infeasible."""
    if not plan.feasible:
        raise PlanError(summary_line(plan), violations=plan.errors)


@dataclass(frozen=True)
class ClusterDocuments:
    """What one configuration renders to: the plan (none for the single-node job, which is not planned), the
    pinned image every document uses, the warnings of the image check and the builders (what ``up`` reports), and
    each document that was asked for (None otherwise). ``polyaxon_cr`` is filled in by the service (Polyaxon's
    converter is an adapter)."""

    plan: Plan | None
    image: str
    warnings: list[str] = field(default_factory=list)
    raycluster: dict[str, Any] | None = None
    operation: dict[str, Any] | None = None
    polyaxon_cr: dict[str, Any] | None = None
    single_node: dict[str, Any] | None = None

    def documents(self, kinds: Collection[Document]) -> dict[Document, dict[str, Any]]:
        """The documents of ``kinds``, in :class:`Document` order (render prints and writes them so)."""
        return {kind: getattr(self, _FIELD[kind]) for kind in Document if kind in kinds}


_FIELD = {Document.operation: "operation", Document.operation_cr: "polyaxon_cr", Document.raycluster: "raycluster",
          Document.single_node: "single_node"}


def pinned_image(cfg: MilesRayConfig) -> tuple[str, list[str]]:
    """The configured image as every document carries it (parsed and normalised), and the pinning warnings."""
    if not cfg.image:
        raise ConfigError("no image given", hint="pass --image repo[:tag]@sha256:<64 hex> or set 'image' in miles-ray.yaml")
    image, warnings = check_image(cfg.image, cfg.allow_unpinned)
    return str(image), list(warnings)


def check_inputs(cfg: MilesRayConfig, single_node: bool = False) -> None:
    """The checks of :func:`prepare` that need no document (a verb calls it before its progress display): every
    missing required input at once, the image pinned, and for a Ray cluster the Ray version given and the split
    feasible."""
    if not cfg.image and not cfg.ray_version and not single_node:
        _missing_image_and_ray_version()
    pinned_image(cfg)
    if not single_node:
        if not cfg.ray_version:
            _missing_ray_version()
        require_feasible(resolve_plan(cfg)[1])


def check_pods_fit(cfg: MilesRayConfig, no_check: bool = False) -> list[str]:
    """``up``/``render`` of a Ray cluster for a recipe that is named (flag, env or file; the built-in default says
    nothing of the jobs the cluster will run): a node's host memory against the pod's (``memory_per_node``),
    a misfit refused in ONE line (exit 2) unless ``no_check`` (:func:`miles_ray.core.memory.check_pod_fit`).
    Returns the notices to print."""
    if "recipe" not in cfg.model_fields_set:
        return []
    recipe, plan = resolve_plan(cfg)
    return check_pod_fit(cfg, recipe, plan, no_check).notices


def _missing_image_and_ray_version() -> None:
    raise ConfigError("no image and no Ray version given",
                      hint="pass --image repo[:tag]@sha256:<64 hex> and --ray-version with the version installed in "
                           "the image, or set 'image' and 'ray_version' in miles-ray.yaml")


def _missing_ray_version() -> None:
    raise ConfigError(
        "no Ray version given",
        hint="pass --ray-version with the version installed in the image "
             "(docker run IMAGE python -c 'import ray; print(ray.__version__)'); it is written to rayVersion",
    )


POLYAXON_GCS_FT = ("--gcs-ft cannot go through Polyaxon: Polyaxon 2.18's raycluster spec has no field for KubeRay's "
                   "gcsFaultToleranceOptions (it rejects unknown fields), so its RayCluster would lose its workers "
                   "with its head")
POLYAXON_GCS_FT_HINT = ("use --via kuberay (render -F kuberay) for a cluster that must survive the loss of its head, "
                        "or drop --gcs-ft for the Polyaxon path")


GCS_FT_NO_PASSWORD = ("gcs_ft_password_secret is none: the GCS fault-tolerance Redis has no password, so anyone who "
                      "reaches it can read and change the Ray cluster's state")


def refuse_gcs_ft_on_polyaxon() -> None:
    """``gcs_ft`` with a Polyaxon document: refused, naming what to do instead."""
    raise ConfigError(POLYAXON_GCS_FT, hint=POLYAXON_GCS_FT_HINT)


def prepare(cfg: MilesRayConfig, kinds: Collection[Document]) -> ClusterDocuments:
    """Check the image, the Ray version and the split, then build the documents of ``kinds``. The single-node job
    is not a Ray cluster of ours (its launcher starts Ray in its pod): no Ray version, no plan, and it is built
    alone. ``Document.operation_cr`` builds the operation it is converted from."""
    kinds = set(kinds)
    if not cfg.image and not cfg.ray_version and Document.single_node not in kinds:
        _missing_image_and_ray_version()  # every missing required input in one line, not one per attempt
    image, warnings = pinned_image(cfg)
    if Document.single_node in kinds:
        if kinds != {Document.single_node}:
            raise ValueError(f"the single-node job is prepared alone, not with {sorted(k.value for k in kinds)}")
        if cfg.gcs_ft:
            raise ConfigError("--gcs-ft is for a KubeRay RayCluster; the single-node job starts Ray inside its one pod",
                              hint="drop --gcs-ft (or gcs_ft in the config) with --single-node")
        job, more = build_single_node(cfg, get_recipe(cfg.recipe, cfg.recipe_file), image)
        return ClusterDocuments(plan=None, image=image, warnings=warnings + more, single_node=job)
    if not cfg.ray_version:
        _missing_ray_version()
    _, plan = resolve_plan(cfg)
    require_feasible(plan)
    if cfg.gcs_ft and kinds & {Document.operation, Document.operation_cr}:
        refuse_gcs_ft_on_polyaxon()
    operation = (apply_to_operation(build_operation(cfg, plan, image, cfg.ray_version), cfg, plan.ray.gpu_workers)
                 if kinds & {Document.operation, Document.operation_cr} else None)
    raycluster = (apply_to_raycluster(build_raycluster(cfg, plan, image, cfg.ray_version), cfg)
                  if Document.raycluster in kinds else None)
    if cfg.gcs_ft and cfg.gcs_ft_password is None:
        warnings.append(GCS_FT_NO_PASSWORD)
    return ClusterDocuments(plan=plan, image=image, warnings=warnings, raycluster=raycluster, operation=operation)
