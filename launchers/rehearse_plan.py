"""The rehearsal's plan (part of ``rehearse.py``, shipped beside it): Miles ``train.py``'s flags, and what Miles
derives from them and places, before any Ray -- the layout, each role's logical bundles and the errors a layout
has. Only the standard library."""

from __future__ import annotations

import argparse
import socket

DESCRIPTION = "Placement rehearsal: runs AS the Ray job in place of Miles's ``train.py``."


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=DESCRIPTION, allow_abbrev=False)
    p.add_argument("--actor-num-nodes", type=int, default=1)
    p.add_argument("--actor-num-gpus-per-node", type=int, default=8)
    p.add_argument("--rollout-num-gpus", type=int, default=None)
    p.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    p.add_argument("--num-gpus-per-node", type=int, default=8)
    p.add_argument("--colocate", action="store_true", default=False)
    p.add_argument("--eval-num-gpus", type=int, default=0)
    p.add_argument("--eval-num-gpus-per-engine", type=int, default=1)
    p.add_argument("--debug-train-only", action="store_true", default=False)
    p.add_argument("--debug-rollout-only", action="store_true", default=False)
    p.add_argument("--load-debug-rollout-data", default=None, help="Miles then runs as --debug-train-only")
    p.add_argument("--rollout-external", action="store_true", default=False)
    p.add_argument("--rollout-external-engine-addrs", nargs="+", default=None)
    p.add_argument("--advantage-estimator", default="grpo", help="ppo adds Miles's critic on the trainer's bundles")
    p.add_argument("--pin-rollout-manager-to-head", action="store_true", default=False)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="bound on the placement group wait (s)")
    p.add_argument("--actor-timeout", type=float, default=600.0, help="bound on starting the actors (s)")
    p.add_argument("--hold", type=float, default=0.0,
                   help="keep the placed actors this many seconds after the checks; fail if one dies meanwhile")
    p.add_argument("--address", default=None, help="Ray address (default: $RAY_ADDRESS, else 'auto')")
    return p.parse_known_args(argv)


def sort_key(item: tuple[int, str, int]) -> tuple[list[int], int]:
    """Miles's key: node IP as numbers (hostname resolved, else character codes), then GPU id."""
    _, node_identifier, gpu_id = item
    try:
        parts = list(map(int, node_identifier.split(".")))
    except ValueError:
        try:
            parts = list(map(int, socket.gethostbyname(node_identifier).split(".")))
        except (socket.gaierror, TypeError):
            parts = [ord(c) for c in node_identifier]
    return parts, gpu_id


def _engine_errors(what: str, flag: str, gpus: int, e: int, g: int) -> list[str]:
    if e <= 0:
        return [f"{flag} must be positive"]
    if gpus % e:
        return [f"{what} GPUs {gpus} are not a multiple of {flag} {e}"]
    if g > 0 and e <= g and g % e:
        return [f"{flag} {e} does not divide --num-gpus-per-node {g}"]
    if g > 0 and e > g and e % g:
        return [f"{flag} {e} > {g} GPUs per node must be a multiple of it"]
    return []


def plan(args: argparse.Namespace) -> tuple[dict, dict, list[str]]:
    """What Miles places for these flags, before anything is placed: ``(layout, placement, errors)``.

    ``layout``: the sizes (reported). ``placement``: LOGICAL bundle indices (positions after the sort by node IP
    and GPU id): ``trainer`` (one per rank), ``critic`` (the same, with PPO), ``engine_actors`` (group, engine,
    node of the engine, first bundle, bundles), ``rollout``/``eval`` (the bundle ranges)."""
    errors: list[str] = []
    g = args.num_gpus_per_node
    debug_train = bool(args.debug_train_only or args.load_debug_rollout_data)
    debug_rollout = bool(args.debug_rollout_only)
    external, colocate = bool(args.rollout_external), bool(args.colocate)
    ann, agpn, r = args.actor_num_nodes, args.actor_num_gpus_per_node, args.rollout_num_gpus
    ev, ee = args.eval_num_gpus, args.eval_num_gpus_per_engine
    if debug_train and debug_rollout:
        errors.append("--debug-rollout-only and --debug-train-only cannot be set at the same time (Miles refuses)")
    if debug_rollout:  # Miles resizes the trainer to the rollout GPUs and drops colocation
        if colocate and not r:
            r = ann * agpn
        elif r:
            agpn = min(8, r)
            ann = r // agpn
        else:
            errors.append("--debug-rollout-only without --colocate needs --rollout-num-gpus")
        colocate = False
    if colocate:
        r = ann * agpn  # Miles forces rollout GPUs to the trainer's when colocated
    a = ann * agpn
    if debug_train:
        mode, (n, offset) = "debug-train-only", (a, 0)
    elif external:
        mode, (n, offset) = "rollout-external", ((0, 0) if debug_rollout else (a, a))
    elif debug_rollout:
        mode, (n, offset) = "debug-rollout-only", (r or 0, 0)
    elif colocate:
        mode, (n, offset) = "colocate", (max(a, r), 0)
    else:
        if r is None:
            errors.append("disaggregated (no --colocate) needs --rollout-num-gpus")
        mode, (n, offset) = "disaggregate", (a + (r or 0) + ev, a)
    r = r or 0
    if n > 0 and a <= 0:
        errors.append("the trainer needs at least one GPU (--actor-num-nodes x --actor-num-gpus-per-node)")
    if g <= 0:
        errors.append("--num-gpus-per-node must be positive")
    if args.actor_num_gpus_per_node > g > 0 and not debug_rollout:  # Miles's own resize may exceed G: not checked
        errors.append(f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} > --num-gpus-per-node {g}")
    if ev < 0:
        errors.append("--eval-num-gpus must be >= 0")
    if ev > 0 and mode != "disaggregate":
        errors.append(f"--eval-num-gpus {ev} needs the disaggregated layout (Miles refuses an eval fleet with "
                      f"{'--colocate' if mode == 'colocate' else '--' + mode})")
    engines_here = mode in ("colocate", "disaggregate", "debug-rollout-only")
    groups: list[tuple[str, int, int, int]] = []  # name, GPUs, GPUs per engine, offset in the rollout range
    if engines_here:
        errors += _engine_errors("rollout", "--rollout-num-gpus-per-engine", r, args.rollout_num_gpus_per_engine, g)
        groups.append(("rollout", r, args.rollout_num_gpus_per_engine, 0))
        if ev > 0:
            errors += _engine_errors("eval", "--eval-num-gpus-per-engine", ev, ee, g)
            groups.append(("eval", ev, ee, r))
    elif args.rollout_num_gpus_per_engine <= 0:
        errors.append("--rollout-num-gpus-per-engine must be positive")
    engine_actors: list[dict] = []
    engines = {"rollout": 0, "eval": 0}
    if not errors:
        for name, gpus, e, group_offset in groups:
            local, per_engine = min(e, g), max(1, e // g)  # GPUs per actor, actors (nodes) per engine
            for i in range(gpus // local):
                first = offset + group_offset + i * local
                engine_actors.append({"group": name, "engine": i // per_engine, "node_of_engine": i % per_engine,
                                      "first": first, "bundles": list(range(first, first + local))})
            engines[name] = gpus // e
    trainer = list(range(a)) if n > 0 and not errors else []
    layout = {
        "mode": mode,
        "colocate": colocate,
        "trainer_gpus": a,
        "actor_num_nodes": ann,
        "actor_num_gpus_per_node": agpn,
        "rollout_gpus": r,
        "eval_gpus": ev if mode == "disaggregate" else 0,
        "bundles": n,
        "rollout_offset": offset,
        "gpus_per_engine": args.rollout_num_gpus_per_engine,
        "eval_gpus_per_engine": ee,
        "engines": engines["rollout"],
        "eval_engines": engines["eval"],
        "engine_actors_planned": len(engine_actors),
        "external_engines": len(args.rollout_external_engine_addrs or []) if mode == "rollout-external" else None,
        "critic": args.advantage_estimator == "ppo",
        "pin_rollout_manager_to_head": bool(args.pin_rollout_manager_to_head),
        "num_gpus_per_node": g,
    }
    placement = {
        "trainer": trainer,
        "critic": list(trainer) if layout["critic"] else [],
        "engine_actors": engine_actors,
        "rollout": list(range(offset, offset + r)) if engines_here else [],
        "eval": list(range(offset + r, offset + r + ev)) if engines_here and ev > 0 else [],
    }
    return layout, placement, errors
