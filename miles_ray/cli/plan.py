"""miles-ray plan: check a trainer/rollout GPU split for a recipe before anything runs."""

from __future__ import annotations

from rich.table import Table

from miles_ray.cli.common import (ConfigOpt, GpusOpt, LayoutOpt, NodesOpt, OutputOpt, RecipeFileOpt, RecipeOpt,
                                  RolloutGpusOpt, RolloutNodesOpt, Output, config_flags, emit, out, warn)
from miles_ray.core.prepare import require_feasible, resolve_plan
from miles_ray.core.config import load_config


def plan_table(plan) -> None:
    t = Table(title=f"{plan.recipe}: {plan.nodes} node(s) x {plan.gpus_per_node} GPUs, {plan.layout}",
              show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("feasible", "[green]yes[/]" if plan.feasible else "[red]no[/]")
    t.add_row("trainer", f"{plan.actor_num_nodes} node(s) x {plan.actor_num_gpus_per_node} GPUs = "
                         f"{plan.trainer_gpus} GPUs, data-parallel {plan.data_parallel}")
    share = "shared with trainer" if plan.colocate else f"{plan.rollout_nodes} node(s)"
    t.add_row("rollout", f"{plan.rollout_num_gpus} GPUs ({share}), {plan.rollout_engines} SGLang engine(s) x "
                         f"{plan.rollout_num_gpus_per_engine} GPU(s)")
    t.add_row("Ray nodes", f"head 0 GPUs; {plan.ray.gpu_workers} GPU worker(s), each >= {plan.ray.gpus_per_worker} "
                           f"GPUs and >= {plan.ray.min_cpus_per_worker} CPUs; +{plan.ray.spare_cpus} spare CPU")
    t.add_row("Miles flags", " ".join(plan.miles_args))
    t.add_row("launcher flags", " ".join(plan.launcher_args))
    out.print(t)
    for v in plan.errors:
        out.print(f"[red]✗ {v.rule}[/]: {v.message}")
    if plan.suggestions:
        out.print("nearest feasible: " + " | ".join(s.describe() for s in plan.suggestions))


def plan_cmd(
    recipe: RecipeOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    layout: LayoutOpt = None,
    rollout_nodes: RolloutNodesOpt = None,
    rollout_gpus: RolloutGpusOpt = None,
    recipe_file: RecipeFileOpt = None,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Plan the trainer/rollout GPU split for a recipe on N nodes x G GPUs, with the exact Miles flags.

    Checks every split rule (Megatron parallel sizes, batch sizes, SGLang engine sizes, MoE expert
    parallelism, disaggregated capacity) and, when a request is infeasible, names each violated rule with
    its numbers and the nearest feasible node counts and layouts. Exit 0 when feasible, 2 when not.
    No cluster and no network needed. To see the whole job submit would send (entrypoint, runtime env,
    run record), also offline: 'miles-ray submit ... --dry-run client'.

    Examples:

    \b
      miles-ray plan --recipe Qwen3-4B --nodes 4
      miles-ray plan --recipe Qwen3-4B --nodes 3 --layout disaggregated --rollout-nodes 1 -o json
    """
    cfg = load_config(config_flags(recipe=recipe, nodes=nodes, gpus_per_node=gpus_per_node, layout=layout,
                                   rollout_nodes=rollout_nodes, rollout_gpus=rollout_gpus,
                                   recipe_file=recipe_file), config)
    _, plan = resolve_plan(cfg)
    for w in plan.warnings:
        warn(w)
    if output is not Output.table:
        emit(plan.model_dump(mode="json"), output, lambda: None)
    require_feasible(plan)  # infeasible: one clear line on stderr, exit 2
    if output is Output.table:
        plan_table(plan)
        out.print(f"the whole job (entrypoint, runtime env, run record), still without a cluster: "
                  f"miles-ray submit --recipe {plan.recipe} --nodes {plan.nodes} -G {plan.gpus_per_node} --dry-run client")
