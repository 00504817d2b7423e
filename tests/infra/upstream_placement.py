"""What upstream Miles places for a set of ``train.py`` flags -- an expectation written for the tests from upstream's
rules (radixark/miles 31f1ca9), independently of ``launchers/rehearse.py``, so that the rehearsal can be checked
against it:

* ``miles/utils/arguments.py``: ``--load-debug-rollout-data`` implies ``--debug-train-only``;
  ``--debug-rollout-only`` resizes the trainer to the rollout GPUs (``min(8, R)`` per node; with ``--colocate`` and
  no ``--rollout-num-gpus`` the rollout takes the trainer's size instead) and turns colocation off; colocated, the
  rollout GPUs ARE the trainer's; PPO (``--advantage-estimator ppo``) adds a critic of the actor's size;
* ``miles/ray/placement_group.py`` (``_get_placement_group_layout``): how many bundles the one PACK group has and
  where the rollout part starts; the bundles are ordered by (node IP as numbers, GPU id); trainer rank r (and
  critic rank r) on ordered bundle r (``train/actor_factory.py``);
* ``miles/ray/rollout/rollout_server.py`` + ``server_group.py``: the rollout fleet, then the eval fleet right after
  it; an engine of E GPUs on G-GPU nodes is ``max(1, E // G)`` actors, one per node, each on the first of its
  ``min(E, G)`` bundles; no engine is started with ``--debug-train-only`` or ``--rollout-external``.

Positions are indices into the ordered bundle list; :func:`ordered_bundles` rebuilds that list from what a rehearsal
reports per node (its IP and the GPU ids of its bundles), with the test's own sort.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Expected:
    bundles: int
    trainer: list[int]
    critic: list[int]
    engines: list[tuple[str, int, int, int]] = field(default_factory=list)  # group, engine, node of engine, position


def expected(*, actor_nodes: int, actor_gpus_per_node: int, gpus_per_node: int, rollout_gpus: int | None = None,
             gpus_per_engine: int = 1, colocate: bool = False, eval_gpus: int = 0, eval_gpus_per_engine: int = 1,
             debug_train_only: bool = False, debug_rollout_only: bool = False, rollout_external: bool = False,
             ppo: bool = False) -> Expected:
    nodes, per_node, rollout = actor_nodes, actor_gpus_per_node, rollout_gpus
    if debug_rollout_only:
        if colocate and not rollout:
            rollout = nodes * per_node
        else:
            per_node = min(8, rollout)
            nodes = rollout // per_node
        colocate = False
    trainer_gpus = nodes * per_node
    if colocate:
        rollout = trainer_gpus
    rollout = rollout or 0

    if debug_train_only:
        size, rollout_start = trainer_gpus, 0
    elif rollout_external:
        size, rollout_start = (0, 0) if debug_rollout_only else (trainer_gpus, trainer_gpus)
    elif debug_rollout_only:
        size, rollout_start = rollout, 0
    elif colocate:
        size, rollout_start = max(trainer_gpus, rollout), 0
    else:
        size, rollout_start = trainer_gpus + rollout + eval_gpus, trainer_gpus

    trainer = list(range(trainer_gpus)) if size else []
    out = Expected(bundles=size, trainer=trainer, critic=list(trainer) if ppo else [])
    if debug_train_only or rollout_external:
        return out
    fleets = [("rollout", rollout, gpus_per_engine)] + ([("eval", eval_gpus, eval_gpus_per_engine)] if eval_gpus else [])
    start = rollout_start
    for name, gpus, e in fleets:
        for engine in range(gpus // e):
            for node in range(max(1, e // gpus_per_node)):
                out.engines.append((name, engine, node, start + engine * e + node * min(e, gpus_per_node)))
        start += gpus
    return out


def ordered_bundles(nodes: list[dict]) -> list[tuple[str, int]]:
    """(node IP, GPU id) of every bundle a rehearsal reports (``nodes[*].ip`` and ``gpu_ids``), in upstream's order."""
    pairs = [(n["ip"], gpu) for n in nodes for gpu in n["gpu_ids"]]
    return sorted(pairs, key=lambda p: ([int(x) for x in p[0].split(".")], p[1]))


def observed(result: dict) -> dict:
    """A rehearsal's result in the expectation's terms: (node IP, GPU id) per trainer and critic rank, and per engine
    actor ``(group, engine, node of engine) -> (node IP, GPU id)``."""
    return {
        "bundles": result["bundles"],
        "trainer": [(r["node"], r["gpu"]) for r in result.get("trainer_ranks", [])],
        "critic": [(r["node"], r["gpu"]) for r in result.get("critic_ranks", [])],
        "engines": sorted((a["group"], a["engine"], a["node_of_engine"], a["node"], a["gpu"])
                          for a in result.get("engine_actors", [])),
    }


def expected_on(exp: Expected, nodes: list[dict]) -> dict:
    """The expectation mapped onto the bundles a rehearsal got (see :func:`ordered_bundles`)."""
    order = ordered_bundles(nodes)
    return {
        "bundles": exp.bundles,
        "trainer": [order[p] for p in exp.trainer],
        "critic": [order[p] for p in exp.critic],
        "engines": sorted((g, e, k, *order[p]) for g, e, k, p in exp.engines),
    }
