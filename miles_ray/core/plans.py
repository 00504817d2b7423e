"""From configuration to plan to the exact objects ``up`` creates -- the "prepare" step of the cluster verbs.
Pure: nothing here reads a cluster or writes anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miles_ray.core.builders import build_operation, build_raycluster
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError, PlanError
from miles_ray.core.images import check_image
from miles_ray.core.planner import Plan, plan_split, summary_line
from miles_ray.core.queues import apply_to_operation, apply_to_raycluster
from miles_ray.core.recipes import Recipe, get_recipe


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
class ClusterObjects:
    """Everything ``up`` on Kubernetes will create: the RayCluster (``via kuberay``) or the Polyaxon operation
    (``via polyaxon``), from one plan and one pinned image."""

    plan: Plan
    image: str
    warnings: list[str] = field(default_factory=list)
    raycluster: dict[str, Any] | None = None
    operation: dict[str, Any] | None = None


def prepare_cluster(cfg: MilesRayConfig, via: str) -> ClusterObjects:
    """Check image, Ray version and split, then build what ``via`` (``kuberay`` or ``polyaxon``) creates. The
    RayCluster is built either way: it is what a re-run of ``up`` compares a live cluster with."""
    if not cfg.image:
        raise ConfigError("no image given", hint="pass --image repo[:tag]@sha256:<64 hex> or set 'image' in miles-ray.yaml")
    image, warnings = check_image(cfg.image, cfg.allow_unpinned)
    if not cfg.ray_version:
        raise ConfigError("no Ray version given", hint="pass --ray-version (the Ray installed in the image)")
    _, plan = resolve_plan(cfg)
    require_feasible(plan)
    raycluster = apply_to_raycluster(build_raycluster(cfg, plan, str(image), cfg.ray_version), cfg)
    operation = (apply_to_operation(build_operation(cfg, plan, cfg.image, cfg.ray_version), cfg, plan.ray.gpu_workers)
                 if via == "polyaxon" else None)
    return ClusterObjects(plan=plan, image=str(image), warnings=list(warnings), raycluster=raycluster,
                          operation=operation)
