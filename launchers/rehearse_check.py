"""The rehearsal's checks and report (part of ``rehearse.py``, shipped beside it): what was placed against what
Miles expects, then the per-node table, the ranks' and engines' nodes, and the result's fields."""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

try:  # imported as the miles_ray.launchers package (the tests)
    from .rehearse_place import Placed, fmt_table, free_per_node
    from .rehearse_plan import sort_key
except ImportError:  # run as the job's script: its siblings are shipped beside it in the working_dir
    from rehearse_place import Placed, fmt_table, free_per_node  # type: ignore[no-redef]
    from rehearse_plan import sort_key  # type: ignore[no-redef]


def ranges(items: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for k, x in enumerate(items):
        if start is None:
            start = x
        if k + 1 == len(items) or items[k + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def check(ray, args: argparse.Namespace, layout: dict, placement: dict, placed: Placed, result: dict,
          errors: list[str]) -> dict:
    """Every check of what :func:`place` placed against what Miles expects (each failure appended to ``errors``);
    what :func:`report` prints from."""
    p = placed
    order, ip_of, node_of, gpu_of, trainer = p.order, p.ip_of, p.node_of, p.gpu_of, p.trainer

    # ---- what each actor reports vs. its bundle ------------------------------------------------
    def ranks(actors_where: list, bundles: list[int], role: str) -> list[dict]:
        out = []
        for rank, (w, b) in enumerate(zip(actors_where, bundles, strict=False)):
            out.append({"rank": rank, "node": w[0], "gpu": w[2][0] if w[2] else -1})
            if (w[1], w[2][:1]) != (node_of[b], [gpu_of[b]]):
                errors.append(f"{role} rank {rank}: runs on {w[0]} GPU {w[2]} but its bundle is on {ip_of[b]} "
                              f"GPU {gpu_of[b]}")
        return out

    trainer_ranks = ranks(p.train_where, trainer, "trainer")
    critic_ranks = ranks(p.critic_where, [order[s] for s in placement["critic"]], "critic")

    g = args.num_gpus_per_node
    cluster = {r["node_id"]: r for r in free_per_node(ray)}
    for nid in p.per_node_gpus:
        total = cluster.get(nid, {}).get("gpus")
        if total is not None and total != g:
            errors.append(
                f"--num-gpus-per-node {g} but node {ip_of[next(i for i in range(p.n) if node_of[i] == nid)]} "
                f"has {total:g} GPUs: Miles would derive wrong engine hosts"
            )
    engine_where = p.engine_where
    engine_actors_out, engines = [], {}
    for k, ea in enumerate(p.engine_plan):
        bundles = [order[s] for s in ea["bundles"]]
        nodes = {node_of[b] for b in bundles}
        entry = {"group": ea["group"], "engine": ea["engine"], "node_of_engine": ea["node_of_engine"],
                 "node": ip_of[bundles[0]], "gpu": gpu_of[bundles[0]], "gpu_ids": [gpu_of[b] for b in bundles]}
        engine_actors_out.append(entry)
        label = f"{ea['group']} engine {ea['engine']}"
        if len(nodes) != 1:
            errors.append(f"{label}: the {len(bundles)} GPUs of its actor {ea['node_of_engine']} span {len(nodes)} nodes")
        if k < len(engine_where) and (engine_where[k][1], engine_where[k][2][:1]) != (node_of[bundles[0]],
                                                                                     [gpu_of[bundles[0]]]):
            errors.append(f"{label}: its actor landed off its first bundle ({engine_where[k][0]} GPU "
                          f"{engine_where[k][2]}, bundle on {ip_of[bundles[0]]} GPU {gpu_of[bundles[0]]})")
        eng = engines.setdefault((ea["group"], ea["engine"]), {"group": ea["group"], "engine": ea["engine"],
                                                              "nodes": [], "gpu_ids": [], "_node_ids": []})
        eng["nodes"].append(ip_of[bundles[0]])
        eng["gpu_ids"] += [gpu_of[b] for b in bundles]
        eng["_node_ids"] += [node_of[b] for b in bundles]
    for eng in engines.values():
        e = layout["gpus_per_engine"] if eng["group"] == "rollout" else layout["eval_gpus_per_engine"]
        counts = Counter(eng.pop("_node_ids"))
        if e > g and (len(counts) != e // g or any(c != g for c in counts.values())):
            errors.append(f"{eng['group']} engine {eng['engine']}: its {e} GPUs do not span {e // g} whole nodes "
                          f"({sorted(counts.values())} GPUs on {len(counts)} nodes)")
    agpn = layout["actor_num_gpus_per_node"]
    for j in range(0, len(trainer) if layout["mode"] != "debug-rollout-only" else 0, max(agpn, 1)):
        block = {node_of[i] for i in trainer[j : j + agpn]}
        if len(block) != 1:
            errors.append(f"trainer ranks {j}-{j + agpn - 1} span {len(block)} nodes (expected one node each)")
    trainer_nodes = Counter(node_of[i] for i in trainer)
    rollout_nodes = Counter(node_of[order[s]] for s in placement["rollout"])
    eval_nodes = Counter(node_of[order[s]] for s in placement["eval"])
    if layout["mode"] == "disaggregate":
        for nid, c in trainer_nodes.items():
            if c != g or rollout_nodes.get(nid) or eval_nodes.get(nid):
                errors.append(
                    f"trainer is not on whole nodes: node {nid[:8]} has {c} trainer, "
                    f"{rollout_nodes.get(nid, 0)} rollout and {eval_nodes.get(nid, 0)} eval bundles"
                )
    if p.manager_where is not None:
        result["rollout_manager_node"] = p.manager_where[0]
        if args.pin_rollout_manager_to_head and p.head is not None and p.manager_where[1] != p.head["NodeID"]:
            errors.append(f"the RolloutManager runs on {p.manager_where[0]}, not on the head {result['head_node']}")
    if p.lock_where is not None:
        result["engine_lock_node"] = p.lock_where[0]
    return {"trainer_ranks": trainer_ranks, "critic_ranks": critic_ranks, "cluster": cluster,
            "engine_actors_out": engine_actors_out, "engines": engines, "trainer_nodes": trainer_nodes,
            "rollout_nodes": rollout_nodes, "eval_nodes": eval_nodes}


def report(placed: Placed, checked: dict, result: dict, errors: list[str], t_start: float) -> None:
    """Print the layout (a per-node table, the trainer ranks' and engines' nodes, the RolloutManager's) and the
    errors, and complete ``result`` with it."""
    p = placed
    ip_of, node_of, order = p.ip_of, p.node_of, p.order
    cluster, engines, trainer_ranks = checked["cluster"], checked["engines"], checked["trainer_ranks"]
    trainer_nodes, rollout_nodes = checked["trainer_nodes"], checked["rollout_nodes"]
    eval_nodes = checked["eval_nodes"]
    first_bundle = {}
    for i in range(p.n):
        first_bundle.setdefault(node_of[i], i)
    node_ids = sorted(first_bundle, key=lambda nid: sort_key((0, ip_of[first_bundle[nid]], 0)))
    actors_on = Counter(node_of[order[ea["first"]]] for ea in p.engine_plan)
    rows, nodes_out = [], []
    for nid in node_ids:
        entry = {
            "ip": ip_of[first_bundle[nid]],
            "node_id": nid,
            "gpus": cluster.get(nid, {}).get("gpus"),
            "bundles": len(p.per_node_gpus[nid]),
            "trainer_bundles": trainer_nodes.get(nid, 0),
            "rollout_bundles": rollout_nodes.get(nid, 0),
            "eval_bundles": eval_nodes.get(nid, 0),
            "engines": actors_on.get(nid, 0),
            "gpu_ids": sorted(p.per_node_gpus[nid]),
        }
        nodes_out.append(entry)
        rows.append([entry["ip"], nid[:8], f"{entry['gpus']:g}" if entry["gpus"] is not None else "?", entry["bundles"],
                     entry["trainer_bundles"], entry["rollout_bundles"], entry["eval_bundles"], entry["engines"]])
    print(fmt_table(rows, ["node", "id", "GPUs", "bundles", "trainer", "rollout", "eval", "engine actors"]),
          flush=True)
    by_node: dict[str, list[int]] = defaultdict(list)
    for t in trainer_ranks:
        by_node[t["node"]].append(t["rank"])
    for ip, rs in by_node.items():
        gpus = [trainer_ranks[x]["gpu"] for x in rs]
        print(f"trainer ranks {ranges(rs)} on {ip} GPUs {ranges(gpus) if gpus == sorted(gpus) else gpus}",
              flush=True)
    on_one_node: dict[tuple[str, str], list[int]] = defaultdict(list)
    for eng in engines.values():
        if len(eng["nodes"]) == 1:
            on_one_node[(eng["group"], eng["nodes"][0])].append(eng["engine"])
        else:
            print(f"{eng['group']} engine {eng['engine']} spans {len(eng['nodes'])} nodes ({', '.join(eng['nodes'])}): "
                  "one actor per node", flush=True)
    for (group, ip), ks in on_one_node.items():
        print(f"{group} engine{'s' if len(ks) > 1 else ''} {ranges(ks)} on {ip}", flush=True)
    if p.manager_where is not None:
        print(f"RolloutManager (1 CPU) on {p.manager_where[0]}, its engine lock (1 CPU) on "
              f"{p.lock_where[0] if p.lock_where else '?'}", flush=True)
    for err in errors:
        print(f"ERROR: {err}", flush=True)

    result.update(
        {
            "ok": not errors,
            "nodes": nodes_out,
            "trainer_ranks": trainer_ranks,
            "critic_ranks": checked["critic_ranks"],
            "engine_actors": checked["engine_actors_out"],
            "engine_layout": list(engines.values()),
            "errors": errors,
            "seconds_total": round(time.monotonic() - t_start, 2),
        }
    )


