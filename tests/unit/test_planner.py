"""Split planner: every built-in recipe on the node counts users ask for, plus properties on
generated recipes checked against an independent oracle of the rules in miles.md."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles_ray.core.planner import RULES, plan_split, summary_line
from miles_ray.core.recipes import BUILTIN, Recipe

NODE_COUNTS = [1, 2, 3, 4, 8, 16]


def oracle(recipe: Recipe, n: int, g: int, layout: str, rollout_nodes: int | None = None,
           rollout_gpus: int | None = None) -> set[str]:
    """The rules of miles.md 'Validity rules', written out independently of the planner.
    Returns the ids of the violated rules."""
    bad: set[str] = set()
    if n < 1 or g < 1:
        return {"positive-sizes"}
    tp, pp, cp = recipe.tensor_parallel, recipe.pipeline_parallel, recipe.context_parallel
    e = recipe.rollout_gpus_per_engine
    if layout == "colocated":
        trainer = rollout = n * g
    else:
        if rollout_nodes is not None:
            r_nodes = rollout_nodes
            rollout = rollout_gpus if rollout_gpus is not None else rollout_nodes * g
            if rollout_gpus is not None and rollout_gpus > rollout_nodes * g:
                bad.add("disagg-capacity")
        elif rollout_gpus is not None:
            rollout = rollout_gpus
            r_nodes = -(-rollout_gpus // g)
        elif recipe.default_rollout_gpus:
            rollout = recipe.default_rollout_gpus
            r_nodes = max(n - recipe.default_actor_nodes, 0)
        else:
            rollout, r_nodes = 0, 0
        trainer = (n - r_nodes) * g
        if rollout <= 0:
            bad.add("disagg-rollout-explicit")
        if n - r_nodes < 1 or (r_nodes < 1 and rollout > 0):
            bad.add("disagg-trainer-whole-nodes")
        if trainer + rollout > n * g:
            bad.add("disagg-capacity")
    if trainer > 0:
        if trainer % (tp * pp * cp):
            bad.add("model-parallel-divides-trainer")
        elif recipe.global_batch_size % (trainer // (tp * pp * cp)):
            bad.add("gbs-divisible-by-dp")
        if recipe.num_experts:
            if trainer % (recipe.expert_tensor_parallel * recipe.expert_parallel * pp):
                bad.add("moe-parallel-divides-trainer")
    if (recipe.rollout_batch_size * recipe.n_samples_per_prompt) % recipe.global_batch_size:
        bad.add("rollout-batch-multiple-of-gbs")
    if rollout > 0:
        if (e <= g and g % e) or (e > g and e % g):
            bad.add("engine-fits-node")
        if rollout % e:
            bad.add("engines-divide-rollout")
        if recipe.attention_heads % e:
            bad.add("engine-divides-heads")
    return bad


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
        assert plan.num_gpus_per_node == g and plan.actor_num_gpus_per_node == g
        assert plan.data_parallel * recipe.model_parallel == plan.trainer_gpus
        assert plan.rollout_engines * recipe.rollout_gpus_per_engine == plan.rollout_num_gpus
    else:
        assert plan.suggestions, "an infeasible plan must suggest feasible alternatives"
        for s in plan.suggestions:
            alt = plan_split(recipe, s.nodes, g, s.layout, s.rollout_nodes)
            assert alt.feasible, s


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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=recipes(), n=st.integers(1, 40), g=st.sampled_from([1, 2, 4, 6, 8, 16]),
       layout=st.sampled_from([None, "colocated", "disaggregated"]),
       rollout_nodes=st.none() | st.integers(0, 40), rollout_gpus=st.none() | st.integers(1, 128))
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
        used = plan.trainer_gpus if plan.colocate else plan.trainer_gpus + plan.rollout_num_gpus
        assert used + plan.idle_gpus == n * g
        assert plan.actor_num_nodes * g == plan.trainer_gpus


@settings(max_examples=60, deadline=None)
@given(recipe=recipes(), n=st.integers(1, 24), g=st.sampled_from([4, 8]))
def test_suggestions_are_feasible(recipe, n, g):
    plan = plan_split(recipe, n, g)
    for s in plan.suggestions:
        assert plan_split(recipe, s.nodes, g, s.layout, s.rollout_nodes, with_suggestions=False).feasible
