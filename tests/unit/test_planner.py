"""Split planner: every built-in recipe on the node counts users ask for, a table of cases worked out by
hand from Miles's rules, and properties on generated recipes checked against an independent oracle
(tests/unit/planner_oracle.py: the rules, a bundle-by-bundle placement simulation and a brute-force search
for feasible alternatives, none of it taken from the planner)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles_ray.core.planner import RULES, plan_split, summary_line
from miles_ray.core.recipes import BUILTIN, Recipe
from tests.unit.planner_oracle import feasible_options, oracle, place, split_of

NODE_COUNTS = [1, 2, 3, 4, 8, 16]


def _check_against_the_simulation(recipe: Recipe, plan, split) -> None:
    """A feasible plan places like Miles would: its numbers are the simulated placement's."""
    sim = place(recipe, split)
    assert (plan.actor_num_nodes, plan.trainer_gpus, plan.rollout_num_gpus) == \
        (split.trainer_nodes, split.trainer_gpus, split.rollout_gpus)
    assert plan.data_parallel == sim.data_parallel and plan.rollout_engines == sim.engines
    assert plan.idle_gpus == sim.idle_gpus
    assert sim.trainer_on_whole_nodes and sim.engines_well_placed
    assert sim.overlap == plan.colocate
    assert plan.num_gpus_per_node == plan.actor_num_gpus_per_node == split.gpus_per_node


# --- cases worked out by hand from the rules ---------------------------------------------------------

B32 = BUILTIN["Qwen3-4B"].model_copy(update={"name": "b32", "rollout_batch_size": 8, "n_samples_per_prompt": 4})
E16_H24 = BUILTIN["Qwen3-4B"].model_copy(update={"name": "e16h24", "tensor_parallel": 1,
                                                 "rollout_gpus_per_engine": 16, "attention_heads": 24})
_K2 = BUILTIN["Kimi-K2"]
# Kimi-K2 is 61 layers on PP8: the launcher makes the last stage 5 layers so the other 7 take 8 each. Without that
# flag (61 % 8) or with a last stage that leaves an uneven rest (61 - 6 = 55 over 7 stages) Megatron cannot split it.
K2_EVEN = _K2.model_copy(update={"name": "k2-even", "train_args": [
    t for i, t in enumerate(_K2.train_args)
    if "--decoder-last-pipeline-num-layers" not in (t, _K2.train_args[i - 1] if i else "")]})
K2_LAST6 = _K2.model_copy(update={"name": "k2-last6", "train_args": [
    "6" if i and _K2.train_args[i - 1] == "--decoder-last-pipeline-num-layers" else t
    for i, t in enumerate(_K2.train_args)]})
RECIPES = {**BUILTIN, B32.name: B32, E16_H24.name: E16_H24, K2_EVEN.name: K2_EVEN, K2_LAST6.name: K2_LAST6}

GBS, MP, MOE = "gbs-divisible-by-dp", "model-parallel-divides-trainer", "moe-parallel-divides-trainer"
FITS, DIVR, HEADS = "engine-fits-node", "engines-divide-rollout", "engine-divides-heads"
WHOLE, CAP, EXPLICIT = "disagg-trainer-whole-nodes", "disagg-capacity", "disagg-rollout-explicit"

# (recipe, N, G, layout (None: the recipe's), rollout nodes, rollout GPUs) -> broken rules, and for a feasible
# request (trainer GPUs A, data-parallel A/(TP*PP*CP), rollout GPUs R, engines R/E, trainer nodes, idle GPUs)
HAND_WORKED = [
    # Qwen3-4B: TP2, E=2, 32 heads, GBS 256, rollout batch 32 x 8 = 256
    ("Qwen3-4B", 1, 8, None, None, None, set(), (8, 4, 8, 4, 1, 0)),
    ("Qwen3-4B", 2, 8, None, None, None, set(), (16, 8, 16, 8, 2, 0)),
    ("Qwen3-4B", 3, 8, None, None, None, {GBS}, None),  # DP 12 does not divide 256
    ("Qwen3-4B", 4, 8, None, None, None, set(), (32, 16, 32, 16, 4, 0)),
    ("Qwen3-4B", 16, 8, None, None, None, set(), (128, 64, 128, 64, 16, 0)),
    ("Qwen3-4B", 32, 8, None, None, None, set(), (256, 128, 256, 128, 32, 0)),
    ("Qwen3-4B", 64, 8, None, None, None, set(), (512, 256, 512, 256, 64, 0)),
    ("Qwen3-4B", 128, 8, None, None, None, {GBS}, None),  # DP 512 > 256
    ("Qwen3-4B", 2, 6, None, None, None, {GBS}, None),  # W 12, DP 6
    ("Qwen3-4B", 1, 4, None, None, None, set(), (4, 2, 4, 2, 1, 0)),
    ("Qwen3-4B", 2, 8, "colocated", 1, None, set(), (16, 8, 16, 8, 2, 0)),  # rollout flags ignored
    ("Qwen3-4B", 3, 8, "disaggregated", 1, None, set(), (16, 8, 8, 4, 2, 0)),
    ("Qwen3-4B", 3, 8, "disaggregated", None, 4, set(), (16, 8, 4, 2, 2, 4)),  # partial last rollout node
    ("Qwen3-4B", 4, 8, "disaggregated", 2, None, set(), (16, 8, 16, 8, 2, 0)),
    ("Qwen3-4B", 4, 8, "disaggregated", None, 10, set(), (16, 8, 10, 5, 2, 6)),
    ("Qwen3-4B", 5, 8, "disaggregated", 1, None, set(), (32, 16, 8, 4, 4, 0)),
    ("Qwen3-4B", 5, 8, "disaggregated", 2, None, {GBS}, None),  # A 24, DP 12
    ("Qwen3-4B", 2, 8, "disaggregated", 1, 8, set(), (8, 4, 8, 4, 1, 0)),
    ("Qwen3-4B", 2, 8, "disaggregated", None, None, {EXPLICIT}, None),  # no rollout GPUs given
    ("Qwen3-4B", 3, 8, "disaggregated", 0, None, {EXPLICIT, GBS}, None),  # trainer keeps 24 GPUs: DP 12
    ("Qwen3-4B", 1, 8, "disaggregated", 1, None, {WHOLE}, None),  # no node left for the trainer
    ("Qwen3-4B", 3, 8, "disaggregated", 3, None, {WHOLE}, None),
    ("Qwen3-4B", 3, 8, "disaggregated", None, 17, {WHOLE, DIVR}, None),  # 17 GPUs need all 3 nodes; 17 % 2
    ("Qwen3-4B", 2, 8, "disaggregated", 1, 12, {CAP}, None),  # 12 GPUs on one 8-GPU node; 8 + 12 > 16
    ("Qwen3-4B", 2, 8, "disaggregated", None, 20, {WHOLE, CAP}, None),  # 20 rollout GPUs on a 16-GPU cluster
    ("Qwen3-4B", 2, 8, "disaggregated", 5, None, {WHOLE, CAP}, None),  # 5 rollout nodes of 2
    ("Qwen3-4B", 2, 8, "disaggregated", 0, 4, {WHOLE, CAP}, None),  # 4 GPUs on 0 rollout nodes
    ("Qwen3.5-9B", 3, 8, None, None, None, {GBS}, None),
    ("Qwen3.5-4B", 3, 8, "disaggregated", None, 3, set(), (16, 8, 3, 3, 2, 5)),  # E=1: any GPU count
    # Qwen3-32B: TP8, E=8, 64 heads
    ("Qwen3-32B", 1, 8, None, None, None, set(), (8, 1, 8, 1, 1, 0)),
    ("Qwen3-32B", 2, 4, None, None, None, set(), (8, 1, 8, 1, 2, 0)),  # an engine spans 2 whole nodes
    ("Qwen3-32B", 3, 4, None, None, None, {MP, DIVR}, None),  # 12 GPUs: not 8k
    ("Qwen3-32B", 3, 8, None, None, None, {GBS}, None),  # DP 3
    ("Qwen3-32B", 1, 6, None, None, None, {MP, FITS, DIVR}, None),  # 8 is neither a divisor nor a multiple of 6
    ("Qwen3-32B", 2, 8, "disaggregated", 1, None, set(), (8, 1, 8, 1, 1, 0)),
    # Qwen3.5-27B: TP4, E=1, 24 heads
    ("Qwen3.5-27B", 2, 8, None, None, None, set(), (16, 4, 16, 16, 2, 0)),
    ("Qwen3.5-27B", 3, 8, None, None, None, {GBS}, None),  # DP 6
    # Qwen3-30B-A3B: TP4, EP8 (ETP1, PP1), E=8, 32 heads, 128 experts
    ("Qwen3-30B-A3B", 1, 8, None, None, None, set(), (8, 2, 8, 1, 1, 0)),
    ("Qwen3-30B-A3B", 1, 4, None, None, None, {MOE, DIVR}, None),  # 4 % 8
    ("Qwen3-30B-A3B", 3, 8, None, None, None, {GBS}, None),  # DP 6
    ("Qwen3-30B-A3B", 1, 6, None, None, None, {MP, MOE, FITS, DIVR}, None),
    # Qwen3-235B-A22B: TP4 PP4 CP2 (32 per replica), EP16 -> ETP*EP*PP 64, E=32, 64 heads; 8 trainer nodes + 64
    ("Qwen3-235B-A22B", 16, 8, None, None, None, set(), (64, 2, 64, 2, 8, 0)),
    ("Qwen3-235B-A22B", 20, 8, None, None, None, set(), (64, 2, 64, 2, 8, 32)),  # 4 spare nodes idle
    ("Qwen3-235B-A22B", 8, 8, None, None, None, {WHOLE, CAP}, None),  # no node left for rollout
    ("Qwen3-235B-A22B", 12, 8, None, None, None, {CAP}, None),  # 64 + 64 > 96
    ("Qwen3-235B-A22B", 4, 8, None, None, None, {WHOLE, CAP, MOE}, None),  # trainer 32 GPUs: 32 % 64
    ("Qwen3-235B-A22B", 16, 8, "colocated", None, None, set(), (128, 4, 128, 4, 16, 0)),
    ("Qwen3-235B-A22B", 16, 8, "disaggregated", 4, None, {GBS, MOE}, None),  # A 96: DP 3, 96 % 64
    # made-up recipes for the rules no built-in breaks
    ("b32", 1, 8, None, None, None, {"rollout-batch-multiple-of-gbs"}, None),  # 8 x 4 = 32, GBS 256
    ("e16h24", 2, 8, None, None, None, {HEADS}, None),  # 24 heads % 16
    ("Qwen3-4B", 0, 8, None, None, None, {"positive-sizes"}, None),
    ("Qwen3-4B-AMD", 1, 8, None, None, None, {"hardware-plannable"}, None),  # an AMD launcher: listed, not planned
    ("Qwen3-4B-NPU", 2, 8, None, None, None, {"hardware-plannable"}, None),
    # a launcher whose layout changes with the node count: listed, not planned
    ("DeepSeek-V3", 4, 8, None, None, None, {"layout-plannable"}, None),
    # uneven last pipeline stage: Kimi-K2 TP8 PP8 CP4 (256 per replica), EP32, E=16 on 32 nodes of 8
    ("Kimi-K2", 32, 8, None, None, None, set(), (256, 1, 256, 16, 32, 0)),
    ("k2-even", 32, 8, None, None, None, {"pipeline-stages-hold-layers"}, None),  # 61 % 8
    ("k2-last6", 32, 8, None, None, None, {"pipeline-stages-hold-layers"}, None),  # (61 - 6) % 7
    ("Kimi-K2", 4, 8, None, None, None, {MP, MOE}, None),  # 32 GPUs: TP*PP*CP 256, EP*PP 256
    ("Qwen3-4B", 2, 0, None, None, None, {"positive-sizes"}, None),
]


@pytest.mark.parametrize("name, n, g, layout, rollout_nodes, rollout_gpus, broken, numbers", HAND_WORKED)
def test_hand_worked_cases(name, n, g, layout, rollout_nodes, rollout_gpus, broken, numbers) -> None:
    """The oracle and the planner both reproduce each case worked out by hand."""
    recipe = RECIPES[name]
    chosen = layout or recipe.default_layout
    assert oracle(recipe, n, g, chosen, rollout_nodes, rollout_gpus) == broken
    plan = plan_split(recipe, n, g, layout, rollout_nodes, rollout_gpus)
    assert {v.rule for v in plan.errors} == broken
    assert plan.feasible == (not broken) == (numbers is not None)
    if numbers:
        a, dp, r, engines, trainer_nodes, idle = numbers
        assert (plan.trainer_gpus, plan.data_parallel, plan.rollout_num_gpus, plan.rollout_engines,
                plan.actor_num_nodes, plan.idle_gpus) == numbers
        split = split_of(recipe, n, g, chosen, rollout_nodes, rollout_gpus)
        sim = place(recipe, split)
        assert (split.trainer_gpus, sim.data_parallel, split.rollout_gpus, sim.engines, split.trainer_nodes,
                sim.idle_gpus) == numbers
        _check_against_the_simulation(recipe, plan, split)


def test_hand_worked_table_covers_every_rule() -> None:
    named = set().union(*(case[6] for case in HAND_WORKED))
    assert named == set(RULES) - {"experts-divisible-by-ep"}  # a recipe with experts % EP is refused on load
    with pytest.raises(ValueError, match="not divisible by expert_parallel"):
        BUILTIN["Qwen3-30B-A3B"].model_validate({**BUILTIN["Qwen3-30B-A3B"].model_dump(), "num_experts": 12})


def test_capacity_is_named_when_rollout_alone_exceeds_the_cluster() -> None:
    """20 rollout GPUs cannot fit on 2 x 8 GPUs: the refusal names the capacity rule with the numbers, not
    only the missing trainer node."""
    plan = plan_split(BUILTIN["Qwen3-4B"], 2, 8, "disaggregated", rollout_gpus=20)
    capacity = [v.message for v in plan.errors if v.rule == "disagg-capacity"]
    assert capacity == ["trainer 0 + rollout 20 GPUs = 20 exceed 2 nodes x 8 GPUs = 16"]


@pytest.mark.parametrize("g", [8, 4])
@pytest.mark.parametrize("n", NODE_COUNTS)
@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_recipe_matches_the_rules(name: str, n: int, g: int) -> None:
    recipe = BUILTIN[name]
    plan = plan_split(recipe, n, g)
    expected = oracle(recipe, n, g, recipe.default_layout)
    assert {v.rule for v in plan.errors} == expected
    assert plan.feasible == (not expected)
    if plan.feasible:
        _check_against_the_simulation(recipe, plan, split_of(recipe, n, g, recipe.default_layout))
    elif expected in ({"hardware-plannable"}, {"layout-plannable"}):
        assert not plan.suggestions, "no size makes an AMD / NPU launcher or a listed layout plannable"
    else:
        assert plan.suggestions, "an infeasible plan must suggest feasible alternatives"
        _check_suggestions(recipe, n, g, plan.suggestions)


def test_qwen3_4b_three_nodes_names_the_dp_rule_with_numbers() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 3, 8)
    assert not plan.feasible
    [v] = plan.errors
    assert v.rule == "gbs-divisible-by-dp"
    assert "256" in v.message and "12" in v.message
    # the same 3 nodes work disaggregated with one rollout node, and 2 or 4 nodes work colocated
    described = {(s.nodes, s.layout, s.rollout_nodes) for s in plan.suggestions}
    assert (3, "disaggregated", 1) in described
    assert {(2, "colocated", None), (4, "colocated", None)} <= described
    assert "gbs-divisible-by-dp" in summary_line(plan)


def test_colocated_flags_are_what_the_upstream_launcher_passes() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 4, 8)
    assert plan.miles_args == ["--colocate", "--actor-num-nodes", "4", "--actor-num-gpus-per-node", "8",
                               "--num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "2"]
    assert plan.launcher_args == ["--num-nodes", "4", "--num-gpus-per-node", "8"]
    assert plan.rollout_num_gpus == 32 and plan.rollout_engines == 16 and plan.data_parallel == 16


def test_disaggregated_split_flags() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 4, 8, "disaggregated", rollout_nodes=2)
    assert plan.feasible
    assert plan.miles_args == ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8",
                               "--rollout-num-gpus-per-engine", "2", "--rollout-num-gpus", "16"]
    assert (plan.trainer_gpus, plan.rollout_num_gpus, plan.rollout_engines, plan.idle_gpus) == (16, 16, 8, 0)


def test_disaggregated_recipe_default_and_capacity() -> None:
    recipe = BUILTIN["Qwen3-235B-A22B"]
    ok = plan_split(recipe, 16, 8)
    assert ok.feasible and ok.layout == "disaggregated"
    assert (ok.actor_num_nodes, ok.rollout_num_gpus, ok.rollout_engines) == (8, 64, 2)
    small = plan_split(recipe, 8, 8)
    assert "disagg-capacity" in {v.rule for v in small.errors}


def test_partial_last_rollout_node_allowed_when_engines_fit() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 3, 8, "disaggregated", rollout_gpus=4)
    assert plan.feasible and plan.rollout_num_gpus == 4 and plan.idle_gpus == 4
    assert any("idle" in w for w in plan.warnings)


def test_moe_expert_parallel_rule() -> None:
    plan = plan_split(BUILTIN["Qwen3-30B-A3B"], 1, 4)
    assert "moe-parallel-divides-trainer" in {v.rule for v in plan.errors}


def test_tp_larger_than_node_warns() -> None:
    plan = plan_split(BUILTIN["Qwen3-32B"], 2, 4)
    assert plan.feasible
    assert any("TP 8" in w for w in plan.warnings)


def test_ray_resources_per_node() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 2, 8)
    assert plan.ray.gpu_workers == 2 and plan.ray.gpus_per_worker == 8
    assert plan.ray.min_cpus_per_worker >= 8 and plan.ray.spare_cpus == 1 and plan.ray.head_gpus == 0


# --- properties on generated recipes -----------------------------------------------------------

def _pow2(lo: int, hi: int):
    return st.sampled_from([2 ** i for i in range(lo, hi + 1)]) | st.integers(1, 12)


@st.composite
def recipes(draw) -> Recipe:
    moe = draw(st.booleans())
    ep = draw(_pow2(0, 4)) if moe else 1
    experts = ep * draw(st.integers(1, 16)) if moe else 0
    layout = draw(st.sampled_from(["colocated", "disaggregated"]))
    kw = {}
    if layout == "disaggregated":
        kw = {"default_actor_nodes": draw(st.integers(1, 8)), "default_rollout_gpus": draw(st.integers(1, 64))}
    return Recipe(
        name="gen", megatron_model_type="gen", hf_dir="gen", megatron_dir="gen_torch_dist",
        tensor_parallel=draw(_pow2(0, 3)), pipeline_parallel=draw(_pow2(0, 2)), context_parallel=draw(_pow2(0, 1)),
        expert_parallel=ep, num_experts=experts, expert_tensor_parallel=draw(st.sampled_from([1, 1, 2])),
        rollout_gpus_per_engine=draw(_pow2(0, 5)), attention_heads=draw(st.sampled_from([8, 12, 16, 24, 32, 40, 64])),
        global_batch_size=draw(st.sampled_from([32, 64, 96, 128, 256, 384, 512])),
        rollout_batch_size=draw(st.sampled_from([8, 16, 32, 64])), n_samples_per_prompt=draw(st.sampled_from([4, 8, 16])),
        default_layout=layout, **kw,
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes(), n=st.integers(1, 40), g=st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
       layout=st.sampled_from([None, "colocated", "disaggregated"]),
       rollout_nodes=st.none() | st.integers(0, 44), rollout_gpus=st.none() | st.integers(1, 300))
def test_plans_satisfy_rules_and_refusals_name_broken_rules(recipe, n, g, layout, rollout_nodes, rollout_gpus):
    plan = plan_split(recipe, n, g, layout, rollout_nodes, rollout_gpus, with_suggestions=False)
    chosen = layout or recipe.default_layout
    expected = oracle(recipe, n, g, chosen, rollout_nodes if chosen == "disaggregated" else None,
                      rollout_gpus if chosen == "disaggregated" else None)
    named = {v.rule for v in plan.errors}
    assert named <= set(RULES)
    # every refusal names only rules that are really broken, and every broken rule is named
    assert named == expected
    assert plan.feasible == (not expected)
    if plan.feasible:
        split = split_of(recipe, n, g, chosen, rollout_nodes if chosen == "disaggregated" else None,
                         rollout_gpus if chosen == "disaggregated" else None)
        _check_against_the_simulation(recipe, plan, split)


def _check_suggestions(recipe: Recipe, n: int, g: int, suggestions) -> None:
    """Suggestions are feasible (for the oracle and the planner), the first is as near as anything feasible
    (brute force over node counts and rollout-node counts), and a disaggregated one uses the fewest rollout
    nodes that work; none at all only when nothing is feasible within twice the request (or 64 nodes)."""
    window = range(1, max(2 * n, 64) + 1)
    if not suggestions:
        assert not feasible_options(recipe, g, window)
        return
    for s in suggestions:
        assert not oracle(recipe, s.nodes, g, s.layout, s.rollout_nodes), s
        assert plan_split(recipe, s.nodes, g, s.layout, s.rollout_nodes, with_suggestions=False).feasible, s
        if s.layout == "disaggregated":
            assert s.rollout_nodes == min(rn for nodes, layout, rn in feasible_options(recipe, g, [s.nodes])
                                          if layout == "disaggregated"), s
    nearest = abs(suggestions[0].nodes - n)
    assert nearest == min(abs(k - n) for k in {o[0] for o in feasible_options(recipe, g, window)})
    assert all(abs(s.nodes - n) >= nearest for s in suggestions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes(), n=st.integers(1, 24), g=st.sampled_from([4, 8]))
def test_suggestions_are_the_nearest_feasible_choices(recipe, n, g):
    plan = plan_split(recipe, n, g)
    if plan.feasible:
        assert plan.suggestions == []
    else:
        _check_suggestions(recipe, n, g, plan.suggestions)


def test_uneven_pipeline_stage_messages_carry_the_numbers() -> None:
    plan = plan_split(K2_LAST6, 32, 8)
    assert [v.message for v in plan.errors] == [
        "61 layers - last 6 = 55 are not divisible by the other 7 of PP 8 stages"]
    assert not plan.suggestions  # no node count fixes the layer split
    assert [v.message for v in plan_split(K2_EVEN, 32, 8).errors] == [
        "61 layers are not divisible by PP 8 (no uneven first/last stage)"]
    assert plan_split(BUILTIN["Qwen3-235B-A22B"], 16, 8).feasible  # 94 layers = 3 x 24 + last 22


def test_a_violation_names_a_catalogued_rule():
    from pydantic import ValidationError

    from miles_ray.core.planner import Violation

    assert Violation(rule="gbs-divisible-by-dp", message="x").rule == "gbs-divisible-by-dp"
    with pytest.raises(ValidationError, match="not in the planner's RULES"):
        Violation(rule="gbs-divisible-by-tp", message="x")
