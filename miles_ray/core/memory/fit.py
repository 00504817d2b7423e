"""Will it fit, and what would: the check every verb that could spend a GPU hour runs (``check_fit``; ``up`` and
``render`` run ``check_pod_fit``), the ONE misfit line, the changes that fit (each planned and estimated before it
is named) and the plan table's "fits" rows. Pure: what is known of the hardware comes in as arguments."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from miles_ray.core.errors import ConfigError, MemoryMisfit
from miles_ray.core.memory.estimate import MemoryEstimate, estimate, job_flags
from miles_ray.core.memory.gpu import GIB, LabelledGpu, parse_size
from miles_ray.core.planner import Plan, plan_split
from miles_ray.core.recipes import Recipe

if TYPE_CHECKING:  # config imports this package (gpu_memory's validator)
    from miles_ray.core.config import MilesRayConfig


# -- what would fit instead ----------------------------------------------------------------------------------------

def _fits(recipe: Recipe, plan: Plan, known: dict, extra: Sequence[str]) -> bool:
    if not plan.feasible:
        return False
    try:
        return estimate(recipe, plan, extra_args=extra, **known).fits
    except ConfigError:
        return False


def suggestions(recipe: Recipe, plan: Plan, est: MemoryEstimate, extra_args: Sequence[str] = (),
                storage_capacity: int | None = None, limit: int = 3) -> list[str]:
    """Concrete changes that fit, each planned (feasible) and estimated (fits) before it is named: more nodes,
    another TP the recipe's heads allow (a recipe file), the optimizer on the CPU, fewer tokens per GPU, another
    SGLang memory fraction."""
    known = {"gpu_bytes": est.gpu_bytes, "memory_per_node": est.host.limit_bytes,
             "storage_capacity": storage_capacity}
    found: list[str] = []
    extra = list(extra_args)
    flags = job_flags(recipe, plan, extra)
    bad = {line.part for line in est.misfits()}

    def replan(nodes: int, r: Recipe = recipe) -> Plan:
        rollout_nodes = plan.rollout_nodes if plan.layout == "disaggregated" else None
        return plan_split(r, nodes, plan.gpus_per_node, plan.layout, rollout_nodes, None, with_suggestions=False)

    if bad & {"trainer", "host"}:
        for nodes in range(plan.nodes + 1, max(2 * plan.nodes, plan.nodes + 8) + 1):
            if _fits(recipe, replan(nodes), known, extra):
                found.append(f"--nodes {nodes}")
                break
        if not flags.optimizer_cpu_offload and "trainer" in bad and not flags.lora:
            more = [*extra, "--optimizer-cpu-offload"]
            if _fits(recipe, plan, known, more):
                found.append("--extra-args '--optimizer-cpu-offload'")
        if "trainer" in bad:
            tokens = flags.max_tokens_per_gpu
            while tokens > 512:
                tokens //= 2
                if _fits(recipe, plan, known, [*extra, "--max-tokens-per-gpu", str(tokens)]):
                    found.append(f"--extra-args '--max-tokens-per-gpu {tokens}'")
                    break
            for tp in (2 * recipe.tensor_parallel, 4 * recipe.tensor_parallel):
                if tp > 64 or recipe.attention_heads % tp:
                    continue
                try:
                    other = recipe.model_copy(update={"tensor_parallel": tp})
                    Recipe.model_validate(other.model_dump())
                except ValueError:
                    continue
                if _fits(other, replan(plan.nodes, other), known, extra):
                    found.append(f"tensor_parallel: {tp} in a recipe file (docs/recipes.md)")
                    break
    if bad & {"rollout", "trainer"}:
        for step in range(1, 10):
            for f in (flags.mem_fraction + 0.05 * step, flags.mem_fraction - 0.05 * step):
                if 0.1 <= f <= 0.95 and _fits(recipe, plan, known, [*extra, "--sglang-mem-fraction-static",
                                                                    f"{f:.2f}"]):
                    found.append(f"--extra-args '--sglang-mem-fraction-static {f:.2f}'")
                    break
            else:
                continue
            break
    return found[:limit + 1]


def gpu_said(est: MemoryEstimate) -> str:
    """Where the GPU memory the estimate holds against came from, as the misfit line says it."""
    if est.gpu_bytes is None:
        return "GPU memory unknown, GPU parts not checked"
    return f"GPU memory from {est.gpu_source or f'{est.gpu_bytes / GIB:.1f} GiB given'}"


def misfit_line(recipe: Recipe, plan: Plan, est: MemoryEstimate, fixes: Sequence[str]) -> str:
    """ONE line: where the GPU memory came from (a flag or config, which node label, or unknown), EVERY part that
    does not fit with GiB needed and available, then the checked changes."""
    refused = any("refuses to start" in n for n in est.notes)
    parts = "; ".join(f"{line.part} needs {line.needed_bytes / GIB:.1f} GiB{' per node' if line.part == 'host' else ''}"
                      f" but has {(line.available_bytes or 0) / GIB:.1f} GiB ({line.what})"
                      + (" (SGLang would refuse to start: no room for the KV cache)"
                         if line.part == "rollout" and refused else "") for line in est.misfits())
    text = (f"{recipe.name} on {plan.nodes} x {plan.gpus_per_node} GPUs ({plan.layout}) does not fit "
            f"({gpu_said(est)}): {parts}")
    bigger = {"trainer": "GPUs with more memory", "rollout": "GPUs with more memory",
              "host": "pods with more memory (memory_per_node)", "storage": "a larger claim or fewer kept checkpoints"}
    instead = " or ".join(dict.fromkeys(bigger[line.part] for line in est.misfits()))
    text += ("; fits with: " + " | ".join(fixes)) if fixes else f"; no checked change fits: use {instead}"
    return text + " (or --no-memory-check)"


def gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.1f}"


def fit_rows(est: MemoryEstimate) -> list[tuple[str, str, str, str]]:
    """The plan table's "fits" rows: part, GiB needed, GiB there, headroom."""
    rows = []
    for line in est.lines:
        head = line.headroom
        rows.append((line.part, gib(line.needed_bytes),
                     f"{gib(line.available_bytes)} ({line.what})" if line.available_bytes else line.what,
                     "-" if head is None else f"{head:.0%}"))
    return rows


# -- the check every verb that could spend a GPU hour runs ---------------------------------------------------------

class FitCheck(BaseModel):
    """The outcome of :func:`check_fit`: the estimate (None when the recipe has no model args and nothing asked
    for a check), whether it was checked, and the notices to print."""

    estimate: MemoryEstimate | None
    checked: bool
    notices: list[str] = Field(default_factory=list)


def known_limits(cfg: MilesRayConfig, labelled: LabelledGpu | None = None) -> tuple[int | None, int | None, str]:
    """What is known to be there: one GPU's memory (``gpu_memory``, the user's word, over what the GPU nodes'
    labels say, over nothing), the pod's memory (only when ``memory_per_node`` was given: the default is what
    ``up`` would create, not what an existing cluster has), and where the GPU figure came from ("" unknown)."""
    gpu_bytes, source = (labelled.gpu_bytes, labelled.source) if labelled and labelled.gpu_bytes else (None, "")
    if cfg.gpu_memory:
        gpu_bytes, source = parse_size(cfg.gpu_memory, what="gpu_memory"), f"gpu_memory {cfg.gpu_memory}"
    host = _pod_memory(cfg.memory_per_node) if "memory_per_node" in cfg.model_fields_set else None
    return gpu_bytes, host, source


_K8S = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "k": 10**3, "M": 10**6,
        "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3}


def _pod_memory(text: str) -> int:
    """A Kubernetes memory quantity (``512Gi``, ``500G``) in bytes; the config validated its form."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", text.strip())
    if not m or m.group(2) not in _K8S:
        raise ConfigError(f"memory_per_node {text!r} is not a Kubernetes quantity such as 512Gi")
    return round(float(m.group(1)) * _K8S[m.group(2)])


def check_fit(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, extra_args: Sequence[str] = (), num_rollout: int | None = None,
              no_check: bool = False, labelled: LabelledGpu | None = None, keep_checkpoints: int | None = None,
              keep_best: bool = False) -> FitCheck:
    """Estimate and hold against what is known; a misfit is a MemoryMisfit (exit 2) in ONE line naming where the
    GPU memory came from, every part that does not fit with the GiB needed and there, and the checked changes that
    fit. ``labelled``: what the GPU nodes' labels say (``gpu_memory`` wins). ``no_check``: estimate, say so, refuse
    nothing. ``keep_checkpoints`` / ``keep_best``: the run's retention (the storage part counts the checkpoints it
    keeps)."""
    gpu, host, source = known_limits(cfg, labelled)
    if not plan.feasible:
        return FitCheck(estimate=None, checked=False)
    try:
        est = estimate(recipe, plan, gpu_bytes=gpu, memory_per_node=host, extra_args=extra_args,
                       num_rollout=num_rollout, gpu_source=source, keep_checkpoints=keep_checkpoints,
                       keep_best=keep_best)
    except ConfigError:
        if no_check or (gpu is None and host is None):
            return FitCheck(estimate=None, checked=False, notices=[
                f"memory not estimated: recipe {recipe.name} has no Megatron model args"])
        raise
    notices = [] if gpu else ["GPU memory unknown: the GPU parts are estimated, not checked (pass --gpu-memory "
                              "SIZE or set gpu_memory)"]
    if no_check:
        return FitCheck(estimate=est, checked=False, notices=[
            "--no-memory-check: the memory estimate is not enforced" + ("" if est.fits else
                                                                           " (it says the job does NOT fit)")])
    if not est.fits:
        raise MemoryMisfit(misfit_line(recipe, plan, est, suggestions(recipe, plan, est, extra_args)))
    return FitCheck(estimate=est, checked=True, notices=notices)


def check_pod_fit(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, no_check: bool = False) -> FitCheck:
    """``up``/``render``: a node's host memory against the pod these documents give it (``memory_per_node``, its
    default included: it is what the pod gets). The GPUs are not checked here (the documents do not say which);
    a recipe without model args is not estimated (nothing said: the cluster may run any job). A misfit is a
    MemoryMisfit in ONE line, as :func:`check_fit`'s; ``no_check``: estimated, said, not refused."""
    if not plan.feasible:
        return FitCheck(estimate=None, checked=False)
    try:
        est = estimate(recipe, plan, memory_per_node=_pod_memory(cfg.memory_per_node))
    except ConfigError:
        return FitCheck(estimate=None, checked=False)
    if no_check:
        return FitCheck(estimate=est, checked=False, notices=[] if est.fits else [
            "--no-memory-check: the memory estimate says the job does NOT fit the pods (not enforced)"])
    if not est.fits:
        raise MemoryMisfit(misfit_line(recipe, plan, est, suggestions(recipe, plan, est)))
    return FitCheck(estimate=est, checked=True)
