#!/usr/bin/env python3
"""Placement rehearsal: runs AS the Ray job in place of Miles's ``train.py``.

It takes Miles ``train.py``'s flags (unknown ones are ignored), derives what Miles derives from them
(``miles/utils/arguments.py``) and places what Miles places, with Miles's resource shapes (radixark/miles
31f1ca9: ``miles/ray/placement_group.py``, ``miles/ray/train/actor_factory.py``,
``miles/ray/rollout/rollout_server.py`` and ``server_group.py``, ``miles/ray/rollout/rollout_manager.py``):

* ONE placement group, strategy PACK, of ``{"GPU": 1, "CPU": 1}`` bundles, re-sorted by (node IP, GPU id) from an
  actor in each bundle that reports ``ray.util.get_node_ip_address()``, ``ray.get_gpu_ids()`` and its node id.
  Its size and where rollout starts in it (A trainer GPUs = actor nodes x GPUs per node, R rollout GPUs):
    ``--debug-train-only`` (or ``--load-debug-rollout-data``): A bundles, no engines;
    ``--rollout-external``: A bundles (none with ``--debug-rollout-only``), the engines are outside Ray;
    ``--debug-rollout-only``: R bundles from 0 (the trainer is resized to R: min(8, R) GPUs per node);
    colocated: max(A, R) bundles (R is forced to A), trainer and engines share them;
    disaggregated: A + R + eval bundles: trainer [0, A), rollout [A, A + R), eval [A + R, A + R + eval);
* trainer rank r: one actor (0.4 GPU, 0.4 CPU) on logical bundle r; with ``--advantage-estimator ppo`` (Miles's
  critic) a second actor of the same shape on the same bundle;
* engines of E GPUs (``--rollout-num-gpus-per-engine``): one actor (0.2 GPU, 0.2 CPU) per NODE of the engine,
  on the first of its min(E, G) bundles -- an engine wider than a node (E > G) is E / G actors on E / G nodes;
  ``--eval-num-gpus`` adds an eval fleet of ``--eval-num-gpus-per-engine`` engines after the rollout GPUs;
* a RolloutManager (1 CPU, 0 GPU) outside the group -- pinned to the head node with
  ``--pin-rollout-manager-to-head`` -- and the engine lock it creates (another 1 CPU, 0 GPU actor).

Checks: the group becomes ready within ``--timeout`` (else the GPU shortfall is printed); every actor reports
the node and GPU of its bundle; each engine actor's bundles sit on one node and an engine wider than a node spans
E / G whole nodes; each block of ``--actor-num-gpus-per-node`` trainer ranks sits on one node; disaggregated
trainers occupy whole nodes; ``--num-gpus-per-node`` equals the GPUs of the nodes used; a pinned RolloutManager
is on the head. Prints a per-node table, the trainer ranks' nodes and GPUs, and a last line
``REHEARSAL_RESULT {json}`` (``trainer_ranks``: rank -> node and GPU; ``engine_actors``; ``nodes``; ...); exit 0
when every check passes, 1 otherwise.

Only ``ray`` and the standard library are imported. In four files by topic, shipped together in the launchers'
working_dir: ``rehearse_plan.py`` (the flags and the plan), ``rehearse_place.py`` (the actors and the group),
``rehearse_check.py`` (the checks and the report) and this one (``main``: plan, place, check, report, release).
"""

from __future__ import annotations

import json
import sys
import time

try:  # imported as the miles_ray.launchers package (the tests)
    from .rehearse_check import check, report
    from .rehearse_place import place, release
    from .rehearse_plan import parse_args, plan
except ImportError:  # run as the job's script: its siblings are shipped beside it in the working_dir
    from rehearse_check import check, report  # type: ignore[no-redef]
    from rehearse_place import place, release  # type: ignore[no-redef]
    from rehearse_plan import parse_args, plan  # type: ignore[no-redef]

RESULT_PREFIX = "REHEARSAL_RESULT "
__all__ = ["emit", "main", "parse_args", "plan"]


def emit(result: dict) -> None:
    sys.stdout.flush()
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(argv)
    t_start = time.monotonic()
    layout, placement, errors = plan(args)
    result: dict = {"ok": False, **layout, "ignored_flags": len(unknown), "errors": errors, "nodes": []}
    print(
        f"rehearsal: {layout['mode']} trainer {layout['trainer_gpus']} GPUs"
        + (" (+ critic)" if layout["critic"] else "")
        + f", rollout {layout['rollout_gpus']} GPUs ({layout['engines']} engines x {layout['gpus_per_engine']})"
        + (f", eval {layout['eval_gpus']} GPUs ({layout['eval_engines']} engines x {layout['eval_gpus_per_engine']})"
           if layout["eval_gpus"] else "")
        + f", {layout['bundles']} bundles, {args.num_gpus_per_node} GPUs per node",
        flush=True,
    )
    if errors:
        for err in errors:
            print(f"ERROR: {err}", flush=True)
        emit(result)
        return 1

    import ray

    placed = place(ray, args, layout, placement, result, errors)
    if placed is None:
        emit(result)
        return 1
    checked = check(ray, args, layout, placement, placed, result, errors)
    report(placed, checked, result, errors, t_start)
    release(ray, args, placed, result, errors)
    emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
