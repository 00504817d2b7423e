#!/usr/bin/env python3
"""Placement rehearsal: runs AS the Ray job in place of Miles's ``train.py``.

It takes the same split flags as Miles ``train.py`` (unknown flags are ignored) and builds the
placement Miles builds (``miles/ray/placement_group.py``):

* ONE placement group, strategy PACK, of ``{"GPU": 1, "CPU": 1}`` bundles;
  colocated: ``max(A, R)`` bundles shared by trainer and rollout (R is forced to A);
  disaggregated: ``A + R`` bundles, trainer ``[0, A)``, rollout ``[A, A + R)``;
* bundles re-sorted by (node IP, GPU id), from an actor in each bundle that reports
  ``ray.util.get_node_ip_address()``, ``ray.get_gpu_ids()`` and its node id;
* one train actor per trainer bundle (0.4 GPU / 0.4 CPU), one engine actor per engine on the
  engine's first bundle (0.2 GPU / 0.2 CPU) -- fractional, so colocated sharing must fit -- and a
  RolloutManager-like actor (1 CPU, 0 GPU) outside the group.

Checks: the group becomes ready within ``--timeout`` (else the GPU shortfall is printed); every
engine's E GPUs sit on one node (E > G: span whole nodes); each block of
``--actor-num-gpus-per-node`` trainer ranks sits on one node; disaggregated trainers occupy whole
nodes; ``--num-gpus-per-node`` equals the GPUs of the nodes used. Prints a per-node table and a last
line ``REHEARSAL_RESULT {json}``; exit 0 when every check passes, 1 otherwise.

Only ``ray`` and the standard library are imported.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import Counter, defaultdict

RESULT_PREFIX = "REHEARSAL_RESULT "


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--actor-num-nodes", type=int, default=1)
    p.add_argument("--actor-num-gpus-per-node", type=int, default=8)
    p.add_argument("--rollout-num-gpus", type=int, default=None)
    p.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    p.add_argument("--num-gpus-per-node", type=int, default=8)
    p.add_argument("--colocate", action="store_true", default=False)
    p.add_argument("--timeout", type=float, default=60.0, help="bound on the placement group wait (s)")
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


def plan(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Bundle layout Miles derives from the flags, and any static rule it breaks."""
    errors: list[str] = []
    a = args.actor_num_nodes * args.actor_num_gpus_per_node
    g = args.num_gpus_per_node
    e = args.rollout_num_gpus_per_engine
    if args.colocate:
        r = a  # Miles forces rollout GPUs to the trainer's when colocated
        num_bundles, offset = max(a, r), 0
    else:
        if args.rollout_num_gpus is None:
            errors.append("disaggregated (no --colocate) needs --rollout-num-gpus")
        r = args.rollout_num_gpus or 0
        num_bundles, offset = a + r, a
    if a <= 0:
        errors.append("the trainer needs at least one GPU (--actor-num-nodes x --actor-num-gpus-per-node)")
    if g <= 0:
        errors.append("--num-gpus-per-node must be positive")
    if e <= 0:
        errors.append("--rollout-num-gpus-per-engine must be positive")
    elif r % e:
        errors.append(f"rollout GPUs {r} are not a multiple of --rollout-num-gpus-per-engine {e}")
    elif g > 0 and e <= g and g % e:
        errors.append(f"--rollout-num-gpus-per-engine {e} does not divide --num-gpus-per-node {g}")
    elif g > 0 and e > g and e % g:
        errors.append(f"--rollout-num-gpus-per-engine {e} > {g} GPUs per node must be a multiple of it")
    if args.actor_num_gpus_per_node > g > 0:
        errors.append(f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} > --num-gpus-per-node {g}")
    layout = {
        "mode": "colocate" if args.colocate else "disaggregate",
        "trainer_gpus": a,
        "rollout_gpus": r,
        "bundles": num_bundles,
        "rollout_offset": offset,
        "gpus_per_engine": e,
        "engines": (r // e) if e > 0 else 0,
        "num_gpus_per_node": g,
        "actor_num_gpus_per_node": args.actor_num_gpus_per_node,
    }
    return layout, errors


def emit(result: dict) -> None:
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


def _fmt_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _free_per_node(ray) -> list[dict]:
    """Total and free GPUs/CPUs of every alive node (free from the GCS, not ``ray status``)."""
    free: dict = {}
    try:
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
    except Exception:  # noqa: BLE001 - private API; fall back to totals only
        free = {}
    rows = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        avail = free.get(n["NodeID"], {})
        rows.append(
            {
                "ip": n.get("NodeManagerAddress"),
                "node_id": n["NodeID"],
                "gpus": float(res.get("GPU", 0)),
                "cpus": float(res.get("CPU", 0)),
                "free_gpus": float(avail.get("GPU", 0)) if free else None,
                "free_cpus": float(avail.get("CPU", 0)) if free else None,
            }
        )
    rows.sort(key=lambda r: (list(map(int, r["ip"].split("."))) if r["ip"] else [], r["node_id"]))
    return rows


def _hold(ray, seconds: float, train_actors: list, engine_actors: list, manager) -> list[str]:
    """Keep the placed actors for ``seconds``, asking each where it is every second; the errors naming every
    actor that died (its node lost) or stopped answering, at the first such round."""
    named = [(f"trainer rank {j}", a) for j, a in enumerate(train_actors)]
    named += [(f"engine {k}", a) for k, a in enumerate(engine_actors)] + [("RolloutManager", manager)]
    where: dict[str, str] = {}
    for label, actor in named:
        try:
            where[label] = ray.get(actor.where.remote(), timeout=30)[0]
        except Exception:  # noqa: BLE001 — reported in the loop below
            where[label] = "?"
    print(f"REHEARSAL_HOLDING {json.dumps({'seconds': seconds, 'actors': len(named)})}", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        refs = [(label, actor.where.remote()) for label, actor in named]
        lost = []
        for label, ref in refs:
            try:
                ray.get(ref, timeout=30)
            except Exception as exc:  # noqa: BLE001 — ActorDiedError, RayActorError, GetTimeoutError
                lost.append(f"{label} on node {where.get(label, '?')} died while held: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200]}")
        if lost:
            for line in lost:
                print(f"ERROR: {line}", flush=True)
            return lost
        time.sleep(1.0)
    print(f"held {seconds:g} s: every actor stayed alive", flush=True)
    return []


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(argv)
    t_start = time.monotonic()
    layout, errors = plan(args)
    result: dict = {"ok": False, **layout, "ignored_flags": len(unknown), "errors": errors, "nodes": []}
    print(
        f"rehearsal: {layout['mode']} trainer {layout['trainer_gpus']} GPUs, rollout {layout['rollout_gpus']} GPUs "
        f"({layout['engines']} engines x {layout['gpus_per_engine']}), {layout['bundles']} bundles, "
        f"{args.num_gpus_per_node} GPUs per node",
        flush=True,
    )
    if errors:
        for err in errors:
            print(f"ERROR: {err}", flush=True)
        emit(result)
        return 1

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"  # never start a new cluster
    if address.startswith(("http://", "https://")):
        address = "auto"  # a dashboard URL is for the Jobs API; inside a job "auto" finds the GCS
    ray.init(address=address, logging_level="WARNING", log_to_driver=True)

    @ray.remote(num_gpus=0.4, num_cpus=0.4)
    class TrainActor:
        """One per bundle while probing (like Miles's InfoActor); trainer bundles keep it."""

        def where(self) -> tuple[str, str, list]:
            return (
                ray.util.get_node_ip_address(),
                ray.get_runtime_context().get_node_id(),
                [int(x) for x in ray.get_gpu_ids()],
            )

    @ray.remote(num_gpus=0.2, num_cpus=0.2)
    class EngineActor:
        def where(self) -> tuple[str, str, list]:
            return (
                ray.util.get_node_ip_address(),
                ray.get_runtime_context().get_node_id(),
                [int(x) for x in ray.get_gpu_ids()],
            )

    @ray.remote(num_cpus=1, num_gpus=0)
    class RolloutManager:
        def where(self) -> tuple[str, str]:
            return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    n = layout["bundles"]
    bundles = [{"GPU": 1, "CPU": 1} for _ in range(n)]
    t0 = time.monotonic()
    pg = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=args.timeout)
    result["seconds_placement"] = round(time.monotonic() - t0, 2)
    if not ready:
        nodes = _free_per_node(ray)
        total_gpus = sum(r["gpus"] for r in nodes)
        free_gpus = sum(r["free_gpus"] or 0 for r in nodes) if nodes and nodes[0]["free_gpus"] is not None else None
        free_cpus = sum(r["free_cpus"] or 0 for r in nodes) if nodes and nodes[0]["free_cpus"] is not None else None
        gpu_nodes = [r for r in nodes if r["gpus"] > 0]
        need_nodes = -(-n // args.num_gpus_per_node) if args.num_gpus_per_node > 0 else None
        short = max(0, n - (free_gpus if free_gpus is not None else total_gpus))
        msg = (
            f"placement group of {n} bundles {{GPU: 1, CPU: 1}} (PACK) not ready after {args.timeout:g}s: "
            f"needs {n} GPUs and {n} CPUs"
            + (f" on {need_nodes} nodes of {args.num_gpus_per_node} GPUs" if need_nodes else "")
            + f"; the cluster has {len(gpu_nodes)} GPU nodes, {total_gpus:g} GPUs"
            + (f", {free_gpus:g} free GPUs, {free_cpus:g} free CPUs" if free_gpus is not None else "")
            + f"; short by {short:g} GPUs"
        )
        errors.append(msg)
        print(f"ERROR: {msg}", flush=True)
        print(
            _fmt_table(
                [[r["ip"], r["node_id"][:8], f"{r['gpus']:g}", f"{r['free_gpus']}", f"{r['cpus']:g}", f"{r['free_cpus']}"]
                 for r in nodes],
                ["node", "id", "GPUs", "free GPUs", "CPUs", "free CPUs"],
            ),
            flush=True,
        )
        result.update(
            {
                "needed_gpus": n,
                "needed_nodes": need_nodes,
                "available_gpus": free_gpus,
                "total_gpus": total_gpus,
                "gpu_nodes": len(gpu_nodes),
                "short_gpus": short,
                "cluster": nodes,
            }
        )
        remove_placement_group(pg)
        emit(result)
        return 1

    # ---- probe: one actor per bundle reports node IP, node id and GPU id ----------------------
    t1 = time.monotonic()

    def in_bundle(cls, i: int):
        return cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        ).remote()

    probes = [in_bundle(TrainActor, i) for i in range(n)]
    manager = RolloutManager.remote()
    try:
        where = ray.get([p.where.remote() for p in probes], timeout=args.actor_timeout)
    except Exception as exc:  # GetTimeoutError, actor died
        errors.append(f"bundle actors did not start within {args.actor_timeout:g}s: {type(exc).__name__}: {exc}")
        emit(result)
        return 1
    infos = [(i, where[i][0], where[i][2][0] if where[i][2] else -1) for i in range(n)]
    order = [i for i, _, _ in sorted(infos, key=sort_key)]  # logical index -> actual bundle index
    ip_of = {i: where[i][0] for i in range(n)}
    node_of = {i: where[i][1] for i in range(n)}
    gpu_of = {i: infos[i][2] for i in range(n)}

    # the group table must agree with where the actors say they are
    try:
        table = ray.util.placement_group_table(pg).get("bundles_to_node_id", {})
        for i in range(n):
            if table and table.get(i) not in (None, node_of[i]):
                errors.append(f"bundle {i}: actor runs on {node_of[i][:8]} but the group put it on {table[i][:8]}")
    except Exception:  # noqa: BLE001
        pass
    per_node_gpus: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        per_node_gpus[node_of[i]].append(gpu_of[i])
    for nid, ids in per_node_gpus.items():
        dup = [g for g, c in Counter(ids).items() if c > 1]
        if dup or -1 in ids:
            errors.append(f"node {nid[:8]}: bundles share or lack GPU ids {sorted(ids)}")

    a, off, e = layout["trainer_gpus"], layout["rollout_offset"], layout["gpus_per_engine"]
    trainer = order[:a]
    rollout = order[off : off + layout["rollout_gpus"]]
    if not args.colocate:  # rollout bundles' probes were only probes (Miles kills its InfoActors)
        for i in rollout:
            ray.kill(probes[i])
    train_actors = [probes[i] for i in trainer]

    # ---- engines: one actor on each engine's first bundle ------------------------------------
    engines = []
    engine_actors = []
    for k in range(layout["engines"]):
        members = rollout[k * e : (k + 1) * e]
        engine_actors.append(in_bundle(EngineActor, members[0]))
        engines.append({"engine": k, "bundles": members})
    try:
        engine_where = ray.get([x.where.remote() for x in engine_actors], timeout=args.actor_timeout)
        train_where = ray.get([x.where.remote() for x in train_actors], timeout=args.actor_timeout)
        manager_where = ray.get(manager.where.remote(), timeout=args.actor_timeout)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"train/engine/rollout-manager actors did not start: {type(exc).__name__}: {exc}")
        engine_where, train_where, manager_where = [], [], None
    result["seconds_actors"] = round(time.monotonic() - t1, 2)
    result["actors"] = {"train": len(train_actors), "engine": len(engine_actors), "rollout_manager": 1}

    # ---- checks -------------------------------------------------------------------------------
    g = args.num_gpus_per_node
    cluster = {r["node_id"]: r for r in _free_per_node(ray)}
    for nid in per_node_gpus:
        total = cluster.get(nid, {}).get("gpus")
        if total is not None and total != g:
            errors.append(
                f"--num-gpus-per-node {g} but node {ip_of[next(i for i in range(n) if node_of[i] == nid)]} "
                f"has {total:g} GPUs: Miles would derive wrong engine hosts"
            )
    for k, eng in enumerate(engines):
        nodes = [node_of[i] for i in eng["bundles"]]
        eng["nodes"] = sorted({ip_of[i] for i in eng["bundles"]}, key=lambda s: sort_key((0, s, 0)))
        eng["gpu_ids"] = [gpu_of[i] for i in eng["bundles"]]
        distinct = set(nodes)
        if e <= g:
            if len(distinct) != 1:
                errors.append(f"engine {k}: its {e} GPUs span {len(distinct)} nodes {eng['nodes']}")
        else:
            counts = Counter(nodes)
            if any(c != g for c in counts.values()) or len(distinct) != e // g:
                errors.append(f"engine {k}: its {e} GPUs do not span {e // g} whole nodes ({dict(counts)})")
        if k < len(engine_where) and engine_where[k][1] != node_of[eng["bundles"][0]]:
            errors.append(f"engine {k}: actor landed off its first bundle's node")
    agpn = args.actor_num_gpus_per_node
    for j in range(0, a, agpn):
        block = {node_of[i] for i in trainer[j : j + agpn]}
        if len(block) != 1:
            errors.append(f"trainer ranks {j}-{j + agpn - 1} span {len(block)} nodes (expected one node each)")
    trainer_nodes = Counter(node_of[i] for i in trainer)
    rollout_nodes = Counter(node_of[i] for i in rollout)
    if not args.colocate:
        for nid, c in trainer_nodes.items():
            if c != g or rollout_nodes.get(nid):
                errors.append(
                    f"trainer is not on whole nodes: node {nid[:8]} has {c} trainer and "
                    f"{rollout_nodes.get(nid, 0)} rollout bundles"
                )
    if manager_where is not None:
        result["rollout_manager_node"] = manager_where[0]

    # ---- layout table -------------------------------------------------------------------------
    node_ids = sorted(set(node_of.values()), key=lambda nid: sort_key((0, ip_of[next(i for i in range(n) if node_of[i] == nid)], 0)))
    engines_on: dict[str, list[int]] = defaultdict(list)
    for eng in engines:
        engines_on[node_of[eng["bundles"][0]]].append(eng["engine"])
    rows, nodes_out = [], []
    for nid in node_ids:
        ip = ip_of[next(i for i in range(n) if node_of[i] == nid)]
        entry = {
            "ip": ip,
            "node_id": nid,
            "gpus": cluster.get(nid, {}).get("gpus"),
            "bundles": sum(1 for i in range(n) if node_of[i] == nid),
            "trainer_bundles": trainer_nodes.get(nid, 0),
            "rollout_bundles": rollout_nodes.get(nid, 0),
            "engines": len(engines_on[nid]),
            "gpu_ids": sorted(per_node_gpus[nid]),
        }
        nodes_out.append(entry)
        eng_ids = engines_on[nid]
        rows.append(
            [
                ip,
                nid[:8],
                f"{entry['gpus']:g}" if entry["gpus"] is not None else "?",
                entry["bundles"],
                entry["trainer_bundles"],
                entry["rollout_bundles"],
                f"{len(eng_ids)} ({eng_ids[0]}-{eng_ids[-1]})" if eng_ids else "0",
            ]
        )
    print(_fmt_table(rows, ["node", "id", "GPUs", "bundles", "trainer", "rollout", "engines (first bundle)"]), flush=True)
    if manager_where is not None:
        print(f"RolloutManager (1 CPU) on {manager_where[0]}", flush=True)
    for err in errors:
        print(f"ERROR: {err}", flush=True)

    result.update(
        {
            "ok": not errors,
            "nodes": nodes_out,
            "engine_layout": [{k: v for k, v in eng.items() if k != "bundles"} for eng in engines],
            "errors": errors,
            "seconds_total": round(time.monotonic() - t_start, 2),
        }
    )
    if args.hold > 0 and not errors:
        errors.extend(_hold(ray, args.hold, train_actors, engine_actors, manager))
        result.update(ok=not errors, errors=errors)
    for actor in [*train_actors, *engine_actors, manager]:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001
            pass
    remove_placement_group(pg)
    emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
