"""An oracle for the split planner, written from Miles's own rules and not from miles_ray/core/planner.py.

Sources: the Miles launcher's split flags and placement (``miles/utils/arguments.py``,
``miles/ray/placement_group.py``) and the validity rules a planner must check before anything is submitted,
as summarised in docs/recipes.md and the README's "How the split is planned". Only the rule ids (the
planner's output vocabulary) are shared with the planner; every check here is worked out on its own:

* a request (N nodes x G GPUs, layout, rollout nodes/GPUs) becomes a concrete split: trainer nodes and GPUs,
  rollout nodes and GPUs (:func:`split_of`);
* each rule is a predicate on that split, stated as in the rules ("there is a data-parallel size d with
  d x TP*PP*CP = trainer GPUs", "E divides G or G divides E") (:func:`broken_rules`);
* Miles's placement group is simulated bundle by bundle (one ``{GPU: 1}`` bundle per GPU, sorted by node;
  trainer ``[0, A)``, rollout ``[A, A + R)``, both ``[0, W)`` when colocated) to count data-parallel
  replicas and engines and to check where every engine and the trainer land (:func:`place`);
* the nearest feasible alternatives are found by brute force over node counts and rollout-node counts
  (:func:`feasible_options`).

How a request maps to a split (the planner's interface, README "Configuration"):
colocated: trainer and rollout share all ``W = N x G`` GPUs (rollout flags are ignored).
disaggregated: ``--rollout-nodes Nr`` gives Nr whole nodes to rollout (``R = Nr x G``, or ``--rollout-gpus``
when that is given too, which must fit on those Nr nodes); ``--rollout-gpus R`` alone puts R GPUs on
``ceil(R / G)`` nodes (a partial last node); with neither, the recipe's defaults: the trainer keeps the recipe's
``default_actor_nodes`` (all N when there are fewer), the other nodes take ``default_rollout_gpus``.
The trainer always holds whole nodes: ``A = Na x G``.

Conventions for splits that cannot exist: the Megatron rules speak about trainer GPUs and are checked only
when there are some (A > 0); the engine rules only when there are rollout GPUs (R > 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_ray.core.recipes import Recipe


@dataclass(frozen=True)
class Split:
    """Where the GPUs go. Colocated: trainer and rollout both use all N x G GPUs."""

    nodes: int
    gpus_per_node: int
    colocated: bool
    trainer_nodes: int
    trainer_gpus: int
    rollout_nodes: int
    rollout_gpus: int
    rollout_fits_its_nodes: bool = True  # --rollout-gpus fits on the --rollout-nodes given with it


def split_of(recipe: Recipe, n: int, g: int, layout: str, rollout_nodes: int | None = None,
             rollout_gpus: int | None = None) -> Split:
    if layout == "colocated":
        return Split(n, g, True, n, n * g, 0, n * g)
    fits = True
    if rollout_nodes is not None:
        nr = rollout_nodes
        r = rollout_gpus if rollout_gpus is not None else nr * g
        fits = rollout_gpus is None or rollout_gpus <= nr * g
        na = n - nr
    elif rollout_gpus is not None:
        r = rollout_gpus
        nr = -(-r // g)  # nodes needed, the last one possibly partial
        na = n - nr
    elif recipe.default_actor_nodes is not None and recipe.default_rollout_gpus is not None:
        na = min(n, recipe.default_actor_nodes)
        nr, r = n - na, recipe.default_rollout_gpus
    else:
        na, nr, r = n, 0, 0
    return Split(n, g, False, na, max(na, 0) * g, nr, r, fits)


def _exact_quotient(total: int, part: int) -> int | None:
    """The k >= 1 with k x part == total (None when there is none)."""
    k, rest = divmod(total, part)
    return k if total > 0 and rest == 0 else None


def _divides(a: int, b: int) -> bool:
    """a | b (b a positive multiple of a)."""
    return _exact_quotient(b, a) is not None


def data_parallel(recipe: Recipe, trainer_gpus: int) -> int | None:
    return _exact_quotient(trainer_gpus, recipe.tensor_parallel * recipe.pipeline_parallel * recipe.context_parallel)


def _layers_fill_stages(recipe: Recipe) -> bool:
    """Megatron gives every pipeline stage its layers: deal them out stage by stage (the first and last stage
    take their --decoder-first/last-pipeline-num-layers when given, the others an equal share) and check that
    each stage gets at least one and none are left over."""
    args = [*recipe.model_args, *recipe.train_args]

    def value(flag: str) -> int | None:
        return int(args[args.index(flag) + 1]) if flag in args else None

    layers, pp = value("--num-layers"), recipe.pipeline_parallel
    first, last = value("--decoder-first-pipeline-num-layers"), value("--decoder-last-pipeline-num-layers")
    if layers is None or (pp == 1 and first is None and last is None):
        return True
    if pp == 1 and first is not None and last is not None:
        return False  # one stage cannot be both an uneven first and an uneven last stage
    fixed = {0: first, pp - 1: last} if pp > 1 else {0: first if first is not None else last}
    fixed = {stage: n for stage, n in fixed.items() if n is not None}
    free = [stage for stage in range(pp) if stage not in fixed]
    left = layers - sum(fixed.values())
    if not free:
        return left == 0
    share = left // len(free)
    return left >= len(free) and share * len(free) == left


def broken_rules(recipe: Recipe, split: Split) -> set[str]:
    """Ids of the violated rules for this split (empty: feasible)."""
    n, g, a, r = split.nodes, split.gpus_per_node, split.trainer_gpus, split.rollout_gpus
    if recipe.hardware != "nvidia":
        return {"hardware-plannable"}  # AMD / NPU launchers: listed in the catalog, never planned
    if recipe.not_planned:
        return {"layout-plannable"}  # launchers whose layout changes with the node count: listed, never planned
    if n < 1 or g < 1:
        return {"positive-sizes"}
    bad: set[str] = set()
    # rollout batch x samples per prompt is a whole number of global batches (else samples are trimmed)
    if _exact_quotient(recipe.rollout_batch_size * recipe.n_samples_per_prompt, recipe.global_batch_size) is None:
        bad.add("rollout-batch-multiple-of-gbs")
    if not _layers_fill_stages(recipe):
        bad.add("pipeline-stages-hold-layers")
    if not split.colocated:
        if r <= 0:
            bad.add("disagg-rollout-explicit")  # rollout GPUs must be given: none here
        if split.trainer_nodes < 1 or (r > 0 and split.rollout_nodes < 1):
            bad.add("disagg-trainer-whole-nodes")  # a whole node for the trainer AND one for rollout
        if a + max(r, 0) > n * g or not split.rollout_fits_its_nodes:
            bad.add("disagg-capacity")
    if a > 0:  # Megatron on the trainer GPUs
        dp = data_parallel(recipe, a)
        if dp is None:
            bad.add("model-parallel-divides-trainer")
        elif not _divides(dp, recipe.global_batch_size):
            bad.add("gbs-divisible-by-dp")
        if recipe.num_experts:
            moe = recipe.expert_tensor_parallel * recipe.expert_parallel * recipe.pipeline_parallel
            if _exact_quotient(a, moe) is None:
                bad.add("moe-parallel-divides-trainer")
            if _exact_quotient(recipe.num_experts, recipe.expert_parallel) is None:
                bad.add("experts-divisible-by-ep")
    if r > 0:  # SGLang engines of E GPUs on the rollout GPUs
        e = recipe.rollout_gpus_per_engine
        if not (_divides(e, g) or _divides(g, e)):
            bad.add("engine-fits-node")
        if _exact_quotient(r, e) is None:
            bad.add("engines-divide-rollout")
        if not _divides(e, recipe.attention_heads):
            bad.add("engine-divides-heads")
    return bad


def oracle(recipe: Recipe, n: int, g: int, layout: str, rollout_nodes: int | None = None,
           rollout_gpus: int | None = None) -> set[str]:
    """Ids of the rules a request breaks."""
    return broken_rules(recipe, split_of(recipe, n, g, layout, rollout_nodes, rollout_gpus))


@dataclass(frozen=True)
class Placement:
    data_parallel: int
    engines: int
    trainer_on_whole_nodes: bool
    engines_well_placed: bool  # each engine on one node (E <= G) or on whole nodes of its own (E > G)
    overlap: bool  # trainer and rollout share bundles
    idle_gpus: int


def place(recipe: Recipe, split: Split) -> Placement:
    """Simulate Miles's placement group for a feasible split, bundle by bundle."""
    g, e = split.gpus_per_node, recipe.rollout_gpus_per_engine
    bundles = [(node, gpu) for node in range(split.nodes) for gpu in range(g)]  # sorted by (node, GPU id)
    trainer = bundles[:split.trainer_gpus]
    rollout = bundles[:split.rollout_gpus] if split.colocated else \
        bundles[split.trainer_gpus:split.trainer_gpus + split.rollout_gpus]
    mp = recipe.tensor_parallel * recipe.pipeline_parallel * recipe.context_parallel
    replicas = [trainer[i:i + mp] for i in range(0, len(trainer), mp)]
    engines = [rollout[i:i + e] for i in range(0, len(rollout), e)]
    trainer_nodes = {node for node, _ in trainer}
    whole = all(sum(1 for nd, _ in trainer if nd == node) == g for node in trainer_nodes)

    def well_placed(engine: list[tuple[int, int]]) -> bool:
        hosts = {node for node, _ in engine}
        if len(engine) != e:
            return False
        if e <= g:
            return len(hosts) == 1
        return all(sum(1 for nd, _ in engine if nd == h) == g for h in hosts)  # every host given whole

    used = set(trainer) | set(rollout)
    return Placement(
        data_parallel=len([r for r in replicas if len(r) == mp]),
        engines=len(engines),
        trainer_on_whole_nodes=whole,
        engines_well_placed=all(map(well_placed, engines)),
        overlap=bool(set(trainer) & set(rollout)),
        idle_gpus=len(bundles) - len(used),
    )


def feasible_options(recipe: Recipe, g: int, node_counts) -> list[tuple[int, str, int | None]]:
    """Every feasible (nodes, layout, rollout nodes) with whole rollout nodes, by brute force."""
    found = []
    for n in node_counts:
        if not oracle(recipe, n, g, "colocated"):
            found.append((n, "colocated", None))
        found += [(n, "disaggregated", rn) for rn in range(1, n)
                  if not oracle(recipe, n, g, "disaggregated", rollout_nodes=rn)]
    return found
