"""Pure verdicts on what the service read from the live head after preparing: its topology against the plan, its
Ray version against the configured one."""

from __future__ import annotations

from miles_ray.core.errors import Conflict
from miles_ray.core.planner import Plan


def check_topology(topology: dict, plan: Plan) -> list[str]:
    """What the live cluster lacks for the plan (empty: enough). Compares GPU worker nodes and GPUs/node.
    ``topology['nodes']`` lists the ALIVE nodes only."""
    gpu_nodes = [n for n in topology["nodes"] if n["gpus"] > 0]
    problems: list[str] = []
    per_node = sorted({int(n["gpus"]) for n in gpu_nodes})
    gpu_nodes = [n for n in gpu_nodes if int(n["gpus"]) >= plan.gpus_per_node] if len(per_node) > 1 else gpu_nodes
    if len(gpu_nodes) < plan.ray.gpu_workers:
        problems.append(f"{len(gpu_nodes)} GPU node(s) alive, the plan needs {plan.ray.gpu_workers} "
                        f"(missing {plan.ray.gpu_workers - len(gpu_nodes)})")
    wrong = [n for n in gpu_nodes if int(n["gpus"]) != plan.gpus_per_node]
    if wrong:
        problems.append(f"GPU nodes advertise {per_node} GPUs each, the plan needs exactly {plan.gpus_per_node} per node "
                        "(--gpus-per-node must be the real per-node count, or engines get the wrong host)")
    few_cpus = [n for n in gpu_nodes if n["cpus"] < plan.gpus_per_node]
    if few_cpus:
        problems.append(f"{len(few_cpus)} GPU node(s) advertise fewer CPUs than GPUs ({plan.gpus_per_node}); "
                        "Miles needs one CPU with every GPU bundle")
    spare = sum(n["cpus"] for n in topology["nodes"]) - plan.trainer_gpus - (
        0 if plan.colocate else plan.rollout_num_gpus)
    if not problems and spare < plan.ray.spare_cpus:  # a missing node explains a CPU shortfall already
        problems.append("no spare CPU for the RolloutManager (one CPU outside the GPU bundles)")
    return problems


def live_shape(topology: dict) -> tuple[int, int] | None:
    """The live cluster's shape as ``--nodes``/``--gpus-per-node`` would say it: its alive GPU workers and the
    GPUs of each (the most common count when they differ); None without a GPU worker."""
    per_node = [int(n["gpus"]) for n in topology["nodes"] if n["gpus"] > 0]
    if not per_node:
        return None
    gpus = max(sorted(set(per_node)), key=per_node.count)
    return sum(1 for g in per_node if g >= gpus), gpus


def topology_fix(topology: dict, plan: Plan) -> str:
    """The flag (or verb) that makes the plan fit the live cluster, for a refusal's hint: ``--gpus-per-node G``
    when the cluster's nodes have another GPU count, ``--nodes N`` for fewer GPU workers than planned (or
    'scale' to add them, or waiting for them)."""
    shape = live_shape(topology)
    fixes = []
    if shape is not None and shape[1] != plan.gpus_per_node:
        fixes.append(f"pass --gpus-per-node {shape[1]} (what each GPU node has)")
    if shape is None or shape[0] < plan.ray.gpu_workers:
        fixes.append((f"plan for what is there (--nodes {shape[0]}), " if shape else "")
                     + f"add GPU workers ('miles-ray scale --nodes {plan.ray.gpu_workers}') or wait for them "
                       "(--wait-for-nodes)")
    return "; ".join(fixes) or "plan for what is there ('miles-ray status' shows it)"


def check_head_ray_version(configured: str | None, live: str | None) -> str | None:
    """The Ray version to record: the head's own, else the configured one. The head, workers and submitter must
    run one Ray version, so a configured version the head does not run is refused."""
    if configured and live and configured != live:
        raise Conflict(f"the cluster runs Ray {live} but the config says {configured}",
                       hint="head, workers and submitter must run one Ray version: fix --ray-version or the image")
    return live or configured
