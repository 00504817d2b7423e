"""miles-ray plan: check a trainer/rollout GPU split for a recipe before anything runs."""

from __future__ import annotations

from rich.table import Table

from miles_ray.cli.common import (ConfigOpt, GpuMemoryOpt, GpusOpt, LayoutOpt, NoMemoryCheckOpt, NodesOpt, OutputOpt,
                                  RecipeFileOpt, RecipeOpt, RolloutGpusOpt, RolloutNodesOpt, Output, config_flags, emit,
                                  out, warn)
from miles_ray.core.errors import PlanError
from miles_ray.core.memory import check_fit, estimate, fit_rows, known_limits
from miles_ray.core.prepare import require_feasible, resolve_plan
from miles_ray.core.config import load_config


def fits_table(est) -> None:
    """The "fits" section: one line per part, GiB needed / GiB there / headroom."""
    t = Table(title=f"fits: {est.parameters / 1e9:.2f}B parameters", title_justify="left")
    for header in ("part", "GiB needed", "GiB there", "headroom"):
        t.add_column(header)
    for part, needed, there, head in fit_rows(est):
        t.add_row(part, needed, there, head)
    out.print(t)


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
    gpu_memory: GpuMemoryOpt = None,
    no_memory_check: NoMemoryCheckOpt = False,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Plan the trainer/rollout GPU split for a recipe on N nodes x G GPUs, with the exact Miles flags.

    Checks every split rule (Megatron parallel sizes, batch sizes, SGLang engine sizes, MoE expert
    parallelism, disaggregated capacity) and, when a request is infeasible, names each violated rule with
    its numbers and the nearest feasible node counts and layouts. Exit 0 when feasible, 2 when not.
    No cluster and no network needed. With --gpu-memory SIZE (or gpu_memory) it also checks that the job fits:
    the trainer's and each rollout engine's GPU memory, the pod's host memory (memory_per_node, when set) and the
    checkpoints; a misfit is exit 2 with the changes that would fit (--no-memory-check: warn instead). To see the whole job submit would send (entrypoint, runtime env,
    run record), also offline: 'miles-ray submit ... --dry-run client'.

    Examples:

    \b
      miles-ray plan --recipe Qwen3-4B --nodes 4
      miles-ray plan --recipe Qwen3-4B --nodes 3 --layout disaggregated --rollout-nodes 1 -o json
    """
    cfg = load_config(config_flags(recipe=recipe, nodes=nodes, gpus_per_node=gpus_per_node, layout=layout,
                                   rollout_nodes=rollout_nodes, rollout_gpus=rollout_gpus,
                                   recipe_file=recipe_file, gpu_memory=gpu_memory), config)
    recipe, plan = resolve_plan(cfg)
    for w in plan.warnings:
        warn(w)
    misfit, fit = None, None
    try:
        fit = check_fit(cfg, recipe, plan, no_check=no_memory_check)
    except PlanError as e:
        misfit = e
    if output is not Output.table:
        data = plan.model_dump(mode="json")
        if fit is not None and fit.estimate is not None:
            data["memory"] = fit.estimate.model_dump(mode="json")
        elif misfit is not None:
            gpu, host, _ = known_limits(cfg)
            data["memory"] = estimate(recipe, plan, gpu_bytes=gpu, memory_per_node=host).model_dump(mode="json")
        emit(data, output, lambda: None)
    require_feasible(plan)  # infeasible: one clear line on stderr, exit 2
    if misfit is not None:
        raise misfit  # does not fit: one line naming the part, the GiB and the changes that fit, exit 2
    for notice in fit.notices if fit else ():
        warn(notice)
    if output is Output.table:
        plan_table(plan)
        if fit is not None and fit.estimate is not None:
            fits_table(fit.estimate)
        out.print(f"the whole job (entrypoint, runtime env, run record), still without a cluster: "
                  f"miles-ray submit --recipe {plan.recipe} --nodes {plan.nodes} -G {plan.gpus_per_node} --dry-run client")
