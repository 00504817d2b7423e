"""Split planner: how N nodes x G GPUs are divided between the Megatron trainer and SGLang rollout.

Pure: no I/O. Every rule in ``RULES`` is checked for every plan; an infeasible request comes back
with each violated rule (id + message with the numbers) and the nearest feasible alternatives.
"""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from miles_ray.core.recipes import Recipe

LayoutChoice = Literal["colocated", "disaggregated"]

RULES: dict[str, str] = {
    "hardware-plannable": "the recipe's launcher targets NVIDIA GPUs (AMD and NPU launchers are listed, not planned)",
    "layout-plannable": ("the recipe's launcher has one layout the planner can express (launchers that change the "
                         "model or the parallel sizes with the node count are listed, not planned)"),
    "positive-sizes": "nodes and GPUs per node are whole numbers >= 1",
    "pipeline-stages-hold-layers": ("PP > 1: the layers fill the pipeline stages: L % PP == 0, or with an uneven first/"
                                    "last stage (--decoder-first/last-pipeline-num-layers) the remaining layers % the "
                                    "remaining stages == 0"),
    "model-parallel-divides-trainer": "trainer GPUs % (TP*PP*CP) == 0",
    "gbs-divisible-by-dp": "global batch size % data-parallel size == 0",
    "rollout-batch-multiple-of-gbs": "(rollout batch x samples per prompt) % global batch size == 0",
    "moe-parallel-divides-trainer": "MoE: trainer GPUs % (ETP*EP*PP) == 0",
    "experts-divisible-by-ep": "MoE: experts % EP == 0",
    "engine-fits-node": "GPUs per engine E: if E <= G then G % E == 0, else E % G == 0",
    "engines-divide-rollout": "rollout GPUs % E == 0",
    "engine-divides-heads": "attention heads % E == 0",
    "disagg-trainer-whole-nodes": "disaggregated: trainer on >= 1 whole nodes, leaving room for rollout",
    "disagg-rollout-explicit": "disaggregated: rollout GPUs > 0, given explicitly",
    "disagg-capacity": "disaggregated: trainer GPUs + rollout GPUs <= nodes x G",
}


class Violation(BaseModel):
    rule: str
    message: str

    @field_validator("rule")
    @classmethod
    def _a_catalogued_rule(cls, rule: str) -> str:
        """Rule names are what users grep for ('[gbs-divisible-by-dp]'): every one is in RULES, with its text."""
        if rule not in RULES:
            raise ValueError(f"rule {rule!r} is not in the planner's RULES")
        return rule


class Suggestion(BaseModel):
    nodes: int
    layout: LayoutChoice
    rollout_nodes: int | None = None
    flags: list[str]

    def describe(self) -> str:
        return " ".join(self.flags)


class NodeResources(BaseModel):
    """What Ray nodes must advertise for this plan."""

    gpu_workers: int
    gpus_per_worker: int
    min_cpus_per_worker: int
    spare_cpus: int = Field(1, description="one CPU outside the placement group for the RolloutManager")
    head_gpus: int = 0


class Plan(BaseModel):
    recipe: str
    recipe_hash: str
    feasible: bool
    layout: LayoutChoice
    nodes: int
    gpus_per_node: int
    colocate: bool
    actor_num_nodes: int
    actor_num_gpus_per_node: int
    trainer_gpus: int
    data_parallel: int | None
    rollout_num_gpus: int
    rollout_num_gpus_per_engine: int
    rollout_engines: int | None
    rollout_nodes: int
    num_gpus_per_node: int
    idle_gpus: int
    miles_args: list[str]
    launcher_args: list[str]
    ray: NodeResources
    errors: list[Violation]
    warnings: list[str]
    suggestions: list[Suggestion]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_megatron(recipe: Recipe, trainer_gpus: int, out: list[Violation]) -> int | None:
    mp = recipe.model_parallel
    dp: int | None = None
    if trainer_gpus % mp:
        out.append(Violation(
            rule="model-parallel-divides-trainer",
            message=(f"{trainer_gpus} trainer GPUs are not divisible by TP*PP*CP = "
                     f"{recipe.tensor_parallel}*{recipe.pipeline_parallel}*{recipe.context_parallel} = {mp}"),
        ))
    else:
        dp = trainer_gpus // mp
        if recipe.global_batch_size % dp:
            out.append(Violation(
                rule="gbs-divisible-by-dp",
                message=(f"global batch size {recipe.global_batch_size} is not divisible by data-parallel size "
                         f"{dp} ({trainer_gpus} trainer GPUs / TP*PP*CP {mp})"),
            ))
    if recipe.is_moe:
        moe = recipe.expert_tensor_parallel * recipe.expert_parallel * recipe.pipeline_parallel
        if trainer_gpus % moe:
            out.append(Violation(
                rule="moe-parallel-divides-trainer",
                message=(f"{trainer_gpus} trainer GPUs are not divisible by ETP*EP*PP = "
                         f"{recipe.expert_tensor_parallel}*{recipe.expert_parallel}*{recipe.pipeline_parallel} = {moe}"),
            ))
        if recipe.num_experts % recipe.expert_parallel:
            out.append(Violation(
                rule="experts-divisible-by-ep",
                message=f"{recipe.num_experts} experts are not divisible by EP {recipe.expert_parallel}",
            ))
    return dp


def _check_pipeline(recipe: Recipe, out: list[Violation]) -> None:
    """Megatron's split of the decoder layers over PP stages (TransformerConfig): without an uneven first/last
    stage every stage gets L / PP layers; with ``--decoder-first-pipeline-num-layers`` and/or
    ``--decoder-last-pipeline-num-layers`` those stages get their counts and the other stages share the rest
    evenly. Only checked when the recipe's model args give the layer count."""
    pp, layers = recipe.pipeline_parallel, recipe.num_layers
    first, last = recipe.pipeline_edge_layers()
    if layers is None or (pp == 1 and first is None and last is None):
        return
    edges = [n for n in (first, last) if n is not None]
    middle_stages = pp - len(edges)
    rest = layers - sum(edges)
    shape = " + ".join(f"{name} {n}" for name, n in (("first", first), ("last", last)) if n is not None)
    if not edges:
        if layers % pp or layers < pp:
            out.append(Violation(rule="pipeline-stages-hold-layers",
                                 message=f"{layers} layers are not divisible by PP {pp} (no uneven first/last stage)"))
        return
    if middle_stages < 0 or rest < 0:
        out.append(Violation(rule="pipeline-stages-hold-layers",
                             message=f"PP {pp} has no room for an uneven {shape} of {layers} layers"))
    elif middle_stages == 0:
        if rest:
            out.append(Violation(rule="pipeline-stages-hold-layers",
                                 message=f"PP {pp} is only the {shape} stage(s), which hold {sum(edges)} of "
                                         f"{layers} layers"))
    elif rest % middle_stages or rest < middle_stages:
        out.append(Violation(rule="pipeline-stages-hold-layers",
                             message=(f"{layers} layers - {shape} = {rest} are not divisible by the other "
                                      f"{middle_stages} of PP {pp} stages")))


def _check_static(recipe: Recipe, out: list[Violation]) -> None:
    """Rules that depend on the recipe alone, not on the split."""
    _check_batch(recipe, out)
    _check_pipeline(recipe, out)


def _check_batch(recipe: Recipe, out: list[Violation]) -> None:
    if recipe.samples_per_rollout % recipe.global_batch_size:
        out.append(Violation(
            rule="rollout-batch-multiple-of-gbs",
            message=(f"rollout batch {recipe.rollout_batch_size} x {recipe.n_samples_per_prompt} samples = "
                     f"{recipe.samples_per_rollout} is not a multiple of global batch size "
                     f"{recipe.global_batch_size} (samples would be trimmed)"),
        ))


def _check_engines(recipe: Recipe, g: int, rollout_gpus: int, out: list[Violation]) -> int | None:
    e = recipe.rollout_gpus_per_engine
    if e <= g and g % e:
        out.append(Violation(rule="engine-fits-node",
                             message=f"{g} GPUs per node are not divisible by {e} GPUs per engine"))
    if e > g and e % g:
        out.append(Violation(rule="engine-fits-node",
                             message=f"an engine of {e} GPUs does not span whole nodes of {g} GPUs"))
    engines: int | None = None
    if rollout_gpus % e:
        out.append(Violation(rule="engines-divide-rollout",
                             message=f"{rollout_gpus} rollout GPUs are not divisible by {e} GPUs per engine"))
    else:
        engines = rollout_gpus // e
    if recipe.attention_heads % e:
        out.append(Violation(rule="engine-divides-heads",
                             message=f"{recipe.attention_heads} attention heads are not divisible by {e} GPUs per engine"))
    return engines


def _core(recipe: Recipe, nodes: int, g: int, layout: LayoutChoice,
          rollout_nodes: int | None, rollout_gpus: int | None) -> Plan:
    errors: list[Violation] = []
    warnings: list[str] = []
    if recipe.hardware == "nvidia" and recipe.not_planned:
        errors.append(Violation(rule="layout-plannable",
                                message=(f"the upstream launcher {recipe.launcher} is listed, not planned: "
                                         f"{recipe.not_planned} (a recipe file can give one of its layouts: "
                                         "docs/recipes.md)")))
        return _assemble(recipe, nodes, g, layout, 0, 0, None, 0, None, 0, errors, warnings)
    if not recipe.plannable:
        errors.append(Violation(rule="hardware-plannable",
                                message=(f"the upstream launcher {recipe.launcher} targets {recipe.hardware.upper()} "
                                         f"hardware{': ' + recipe.hardware_note if recipe.hardware_note else ''}; "
                                         "only NVIDIA GPU clusters are planned")))
        return _assemble(recipe, nodes, g, layout, 0, 0, None, 0, None, 0, errors, warnings)
    if nodes < 1 or g < 1:
        errors.append(Violation(rule="positive-sizes",
                                message=f"nodes ({nodes}) and GPUs per node ({g}) must be >= 1"))
        return _assemble(recipe, nodes, g, layout, 0, 0, None, 0, None, 0, errors, warnings)

    _check_static(recipe, errors)
    if layout == "colocated":
        w = nodes * g
        dp = _check_megatron(recipe, w, errors)
        engines = _check_engines(recipe, g, w, errors)
        if rollout_nodes or rollout_gpus:
            warnings.append("rollout nodes/GPUs are ignored when colocated: rollout shares all trainer GPUs")
        plan = _assemble(recipe, nodes, g, layout, nodes, w, dp, w, engines, 0, errors, warnings)
    else:
        # Work out R (rollout GPUs) and Na (trainer nodes). R must be explicit.
        if rollout_nodes is not None:
            r = rollout_nodes * g if rollout_gpus is None else rollout_gpus
            if rollout_gpus is not None and rollout_gpus > rollout_nodes * g:
                errors.append(Violation(rule="disagg-capacity",
                                        message=(f"{rollout_gpus} rollout GPUs do not fit on {rollout_nodes} rollout "
                                                 f"node(s) of {g} GPUs")))
            r_nodes = rollout_nodes
        elif rollout_gpus is not None:
            r = rollout_gpus
            r_nodes = _ceil_div(r, g)
        elif recipe.default_rollout_gpus is not None and recipe.default_actor_nodes is not None:
            r = recipe.default_rollout_gpus
            r_nodes = max(nodes - recipe.default_actor_nodes, 0)
        else:
            r, r_nodes = 0, 0
        na = nodes - r_nodes
        a = max(na, 0) * g  # no trainer node left: 0 trainer GPUs (not a negative count offsetting R)
        if r <= 0:
            errors.append(Violation(rule="disagg-rollout-explicit",
                                    message="disaggregated layout needs rollout GPUs: pass --rollout-nodes or --rollout-gpus"))
        if na < 1:
            errors.append(Violation(rule="disagg-trainer-whole-nodes",
                                    message=(f"{r_nodes} rollout node(s) of {nodes} leave no whole node for the trainer")))
        if r_nodes < 1 and r > 0:
            errors.append(Violation(rule="disagg-trainer-whole-nodes",
                                    message="no node is left for rollout"))
        if a + r > nodes * g:
            errors.append(Violation(rule="disagg-capacity",
                                    message=(f"trainer {a} + rollout {r} GPUs = {a + r} exceed {nodes} nodes x {g} GPUs "
                                             f"= {nodes * g}")))
        dp = _check_megatron(recipe, a, errors) if a > 0 else None
        engines = _check_engines(recipe, g, r, errors) if r > 0 else None
        plan = _assemble(recipe, nodes, g, layout, max(na, 0), max(a, 0), dp, max(r, 0), engines,
                         max(r_nodes, 0), errors, warnings)
    if recipe.tensor_parallel > g:
        plan.warnings.append(f"TP {recipe.tensor_parallel} is larger than {g} GPUs per node: tensor parallelism "
                             "will cross nodes (slow); prefer nodes with >= TP GPUs")
    if recipe.launcher_max_nodes and nodes > recipe.launcher_max_nodes:
        plan.warnings.append(f"the upstream launcher {recipe.launcher} has a layout for at most "
                             f"{recipe.launcher_max_nodes} node(s) (given {nodes} it refuses or submits its own size); "
                             f"direct mode reuses its "
                             f"{recipe.launcher_max_nodes}-node flags with this split")
    if recipe.launcher_min_nodes and nodes < recipe.launcher_min_nodes:
        plan.warnings.append(f"the upstream launcher {recipe.launcher} submits this layout from "
                             f"{recipe.launcher_min_nodes} nodes on (on fewer it refuses, runs a debug layout "
                             "or asks for its own node count); direct mode uses the catalog's flags with this split")
    if plan.idle_gpus and not plan.errors:
        plan.warnings.append(f"{plan.idle_gpus} GPU(s) stay idle with this split")
    return plan


def _assemble(recipe: Recipe, nodes: int, g: int, layout: LayoutChoice, actor_nodes: int, trainer_gpus: int,
              dp: int | None, rollout_gpus: int, engines: int | None, rollout_nodes: int,
              errors: list[Violation], warnings: list[str]) -> Plan:
    colocate = layout == "colocated"
    e = recipe.rollout_gpus_per_engine
    args = [
        "--actor-num-nodes", str(actor_nodes),
        "--actor-num-gpus-per-node", str(g),
        "--num-gpus-per-node", str(g),
        "--rollout-num-gpus-per-engine", str(e),
    ]
    if colocate:
        args = ["--colocate", *args]
    else:
        args += ["--rollout-num-gpus", str(rollout_gpus)]
    used = trainer_gpus if colocate else trainer_gpus + rollout_gpus
    return Plan(
        recipe=recipe.name,
        recipe_hash=recipe.content_hash(),
        feasible=not errors,
        layout=layout,
        nodes=nodes,
        gpus_per_node=g,
        colocate=colocate,
        actor_num_nodes=actor_nodes,
        actor_num_gpus_per_node=g,
        trainer_gpus=trainer_gpus,
        data_parallel=dp,
        rollout_num_gpus=rollout_gpus,
        rollout_num_gpus_per_engine=e,
        rollout_engines=engines,
        rollout_nodes=rollout_nodes,
        num_gpus_per_node=g,
        idle_gpus=max(nodes * g - used, 0) if nodes > 0 and g > 0 else 0,
        miles_args=args,
        launcher_args=["--num-nodes", str(nodes), "--num-gpus-per-node", str(g)],
        ray=NodeResources(gpu_workers=max(nodes, 0), gpus_per_worker=max(g, 0), min_cpus_per_worker=max(g, 0)),
        errors=errors,
        warnings=warnings,
        suggestions=[],
    )


def _flags(nodes: int, layout: LayoutChoice, rollout_nodes: int | None) -> list[str]:
    flags = ["--nodes", str(nodes), "--layout", layout]
    if layout == "disaggregated" and rollout_nodes is not None:
        flags += ["--rollout-nodes", str(rollout_nodes)]
    return flags


def suggest(recipe: Recipe, nodes: int, g: int, limit: int = 3) -> list[Suggestion]:
    """Nearest feasible (node count, layout) choices for this recipe on G-GPU nodes.

    Searches outward from the requested node count; for a disaggregated layout it picks the fewest
    rollout nodes that work. Rule checks are memoised per trainer/rollout size, so this stays fast for
    thousands of nodes.
    """
    if g < 1 or not recipe.plannable:
        return []
    batch_ok = not _violations(lambda out: _check_static(recipe, out))

    @functools.lru_cache(maxsize=None)
    def trainer_ok(gpus: int) -> bool:
        return not _violations(lambda out: _check_megatron(recipe, gpus, out))

    @functools.lru_cache(maxsize=None)
    def rollout_ok(gpus: int) -> bool:
        return not _violations(lambda out: _check_engines(recipe, g, gpus, out))

    if not batch_ok:
        return []
    found: list[Suggestion] = []
    start = max(nodes, 1)
    horizon = max(2 * start, 64)
    for d in range(0, horizon + 1):
        for n in sorted({start - d, start + d}):
            if n < 1 or n > horizon:
                continue
            if trainer_ok(n * g) and rollout_ok(n * g):
                found.append(Suggestion(nodes=n, layout="colocated", flags=_flags(n, "colocated", None)))
            for rn in range(1, n):
                if trainer_ok((n - rn) * g) and rollout_ok(rn * g):
                    found.append(Suggestion(nodes=n, layout="disaggregated", rollout_nodes=rn,
                                            flags=_flags(n, "disaggregated", rn)))
                    break
        if len(found) >= limit:
            break
    found.sort(key=lambda s: (abs(s.nodes - start), s.layout != "colocated", s.nodes))
    found = found[:limit]
    if not any(s.layout == "colocated" for s in found):
        # also name the nearest colocated size, often the simpler answer (e.g. fewer, busier nodes)
        near = [n for n in range(1, horizon + 1) if trainer_ok(n * g) and rollout_ok(n * g)]
        if near:
            n = min(near, key=lambda n: (abs(n - start), n))
            found.append(Suggestion(nodes=n, layout="colocated", flags=_flags(n, "colocated", None)))
    return found


def _violations(check) -> list[Violation]:
    out: list[Violation] = []
    check(out)
    return out


def plan_split(recipe: Recipe, nodes: int, gpus_per_node: int, layout: LayoutChoice | None = None,
               rollout_nodes: int | None = None, rollout_gpus: int | None = None,
               with_suggestions: bool = True) -> Plan:
    """Plan a split. ``layout=None`` takes the recipe's default layout."""
    chosen: LayoutChoice = layout or recipe.default_layout
    plan = _core(recipe, nodes, gpus_per_node, chosen, rollout_nodes, rollout_gpus)
    if not plan.feasible and with_suggestions:
        plan.suggestions = suggest(recipe, nodes, gpus_per_node)
    return plan


def summary_line(plan: Plan) -> str:
    """One line naming every violated rule, for error output."""
    rules = "; ".join(f"[{v.rule}] {v.message}" for v in plan.errors)
    text = f"{plan.recipe} on {plan.nodes} x {plan.gpus_per_node} GPUs ({plan.layout}) is infeasible: {rules}"
    if plan.suggestions:
        text += "; nearest feasible: " + " | ".join(s.describe() for s in plan.suggestions)
    return text
