"""doctor's memory findings, one per part of the estimate (miles_ray.core.memory): ``memory_trainer`` (the most
loaded trainer GPU), ``memory_rollout`` (each rollout engine GPU), ``memory_host`` (a node's pod) and
``memory_storage`` (the checkpoints kept: all, or as many as the run's retention keeps). For a run, its recipe, split and job flags as recorded; for a cluster,
the job the configuration plans. The GPU memory is the configured one, else the GPU nodes' labels (Kubernetes),
else unknown (``skipped``)."""

from __future__ import annotations

import shlex
from typing import Any

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import MilesRayError
from miles_ray.core.memory import FitLine, MemoryEstimate, estimate, gib, known_limits, misfit_line, suggestions
from miles_ray.core.planner import Plan, plan_split
from miles_ray.core.prepare import resolve_plan
from miles_ray.core.recipes import Recipe
from miles_ray.core.records import Controller, as_record
from miles_ray.services.doctor.findings import OK, PROBLEM, SKIPPED, WARNING, Finding, finding
from miles_ray.services.node_gpus import cluster_gpu_memory

TIGHT = 0.10  # headroom below this share is a warning: a longer response or fragmentation can tip it over


def _job(cfg: MilesRayConfig, record: dict[str, Any] | None) -> tuple[Recipe, Plan, list[str], str]:
    """The recipe, plan and train.py flags of the run (as recorded) or of the configuration's job."""
    if record is None:
        recipe, plan = resolve_plan(cfg)
        return recipe, plan, [], f"{recipe.name} on {plan.nodes} x {plan.gpus_per_node} GPUs (the configuration's job)"
    rec = as_record(record)
    recipe = Recipe.model_validate(rec.recipe_spec)
    split = rec.split
    apart = split.get("layout") == "disaggregated"  # its rollout nodes and GPUs as planned
    plan = plan_split(recipe, split["nodes"], split["gpus_per_node"], split.get("layout"),
                      split["nodes"] - split["actor_num_nodes"] if apart else None,
                      split.get("rollout_num_gpus") if apart else None, with_suggestions=False)
    try:
        args = shlex.split(rec.entrypoint or "")
    except ValueError:
        args = []
    return recipe, plan, args, f"run {rec.run}: {recipe.name} on {plan.nodes} x {plan.gpus_per_node} GPUs"


def _part(line: FitLine, what: str, fix: str, misfit: str) -> Finding:
    check = f"memory_{line.part}"
    needed = f"needs {gib(line.needed_bytes)} GiB{' per node' if line.part == 'host' else ''}"
    if line.available_bytes is None:
        return finding(check, "memory", SKIPPED, f"{what}: {line.part} {needed}; not checked ({line.what})",
                       [], "pass --gpu-memory SIZE or set gpu_memory / memory_per_node" if line.part != "storage"
                       else "")
    evidence = [f"{line.part}: {gib(line.needed_bytes)} GiB needed, {gib(line.available_bytes)} GiB there ({line.what})"]
    if not line.fits:
        return finding(check, "memory", misfit, f"{what}: {line.part} {needed} but has "
                       f"{gib(line.available_bytes)} GiB", evidence, fix)
    head = line.headroom or 0.0
    status = WARNING if head < TIGHT else OK
    return finding(check, "memory", status, f"{what}: {line.part} {needed} of {gib(line.available_bytes)} GiB "
                   f"({head:.0%} headroom{', tight' if status == WARNING else ''})", evidence,
                   "leave more room: see the changes 'miles-ray plan' names" if status == WARNING else "")


def memory_findings(cfg: MilesRayConfig, record: dict[str, Any] | None, head: str | None) -> list[Finding]:
    """One finding per part (never raises: what cannot be estimated is one ``skipped`` finding). A misfit is a
    ``problem`` for a run, a ``warning`` for the configuration's job; headroom under 10% a ``warning``."""
    rec = as_record(record) if record is not None else None
    if rec is not None and rec.mode == "rehearse":
        return [finding("memory", "memory", SKIPPED, f"run {rec.run} is a rehearsal: it loads no model")]
    try:
        recipe, plan, args, what = _job(cfg, record)
        if not plan.feasible:
            return [finding("memory", "memory", SKIPPED, f"{what}: the split is not feasible",
                            fix="'miles-ray plan' names the rules it breaks")]
        labelled, notice = cluster_gpu_memory(cfg, head) if head else (None, None)
        gpu, host, source = known_limits(cfg, labelled)
        sup = (rec.supervisor if rec is not None else None) or Controller()  # its retention: the checkpoints it keeps
        est: MemoryEstimate = estimate(recipe, plan, gpu_bytes=gpu, memory_per_node=host, extra_args=args,
                                       gpu_source=source, keep_checkpoints=sup.keep_checkpoints,
                                       keep_best=bool(sup.keep_best))
    except (MilesRayError, KeyError, ValueError, TypeError) as e:
        return [finding("memory", "memory", SKIPPED, f"memory not estimated: {getattr(e, 'message', None) or e}",
                        fix=getattr(e, "hint", None) or "")]
    # the misfit line's last clause: the checked changes that fit, or what would
    fix = "" if est.fits else misfit_line(recipe, plan, est, suggestions(recipe, plan, est, args)).rpartition("; ")[2]
    # a run's misfit is a problem; the configuration's job (not running) a warning
    found = [_part(line, what, fix, PROBLEM if record else WARNING) for line in est.lines]
    if notice or source:
        found[0].evidence.append(notice or f"GPU memory from {source}")
    return found
