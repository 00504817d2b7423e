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
from types import SimpleNamespace

RESULT_PREFIX = "REHEARSAL_RESULT "
ACTOR_SHAPE = {"train": 0.4, "engine": 0.2}  # GPU (and CPU) of one actor in its bundle, as Miles asks


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
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


def emit(result: dict) -> None:
    sys.stdout.flush()
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


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


def _hold(ray, seconds: float, named: list[tuple[str, object]]) -> list[str]:
    """Keep the placed actors (``named``: label, actor) for ``seconds``, asking each where it is every second; the
    errors naming every actor that died (its node lost) or stopped answering, at the first such round."""
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


def _ranges(items: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for k, x in enumerate(items):
        if start is None:
            start = x
        if k + 1 == len(items) or items[k + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def _not_ready(ray, args, n: int) -> tuple[str, dict]:
    """Why a group of ``n`` bundles is not ready: the numbers, a per-node table, and the result fields."""
    nodes = _free_per_node(ray)
    total_gpus = sum(r["gpus"] for r in nodes)
    known = bool(nodes) and nodes[0]["free_gpus"] is not None
    free_gpus = sum(r["free_gpus"] or 0 for r in nodes) if known else None
    free_cpus = sum(r["free_cpus"] or 0 for r in nodes) if known else None
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
    table = _fmt_table(
        [[r["ip"], r["node_id"][:8], f"{r['gpus']:g}", f"{r['free_gpus']}", f"{r['cpus']:g}", f"{r['free_cpus']}"]
         for r in nodes],
        ["node", "id", "GPUs", "free GPUs", "CPUs", "free CPUs"],
    )
    fields = {"needed_gpus": n, "needed_nodes": need_nodes, "available_gpus": free_gpus, "total_gpus": total_gpus,
              "gpu_nodes": len(gpu_nodes), "short_gpus": short, "cluster": nodes}
    return msg + "\n" + table, fields


class Placed(SimpleNamespace):
    """What :func:`place` put on the cluster and where each bundle turned out to be (bundle index -> node IP, node
    id, GPU id; ``order``: logical index -> actual bundle index, as Miles re-sorts them)."""


def _actor_classes(ray):
    """The rehearsal's actors, with Miles's shapes (``ray`` is imported only once the plan holds)."""

    def _where() -> tuple[str, str, list]:
        return (ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(),
                [int(x) for x in ray.get_gpu_ids()])

    @ray.remote(num_gpus=ACTOR_SHAPE["train"], num_cpus=ACTOR_SHAPE["train"])
    class TrainActor:
        """One per bundle while probing (like Miles's InfoActor); trainer bundles keep it as the rank's actor."""

        def where(self) -> tuple[str, str, list]:
            return _where()

    @ray.remote(num_gpus=ACTOR_SHAPE["engine"], num_cpus=ACTOR_SHAPE["engine"])
    class EngineActor:
        def where(self) -> tuple[str, str, list]:
            return _where()

    @ray.remote
    class EngineLock:
        def where(self) -> tuple[str, str, list]:
            return _where()

    @ray.remote(num_cpus=1, num_gpus=0)
    class RolloutManager:
        """Like Miles's: outside the group, and it creates the engine lock (1 CPU) from where it runs."""

        def __init__(self) -> None:
            self.lock = EngineLock.options(num_cpus=1, num_gpus=0).remote()

        def where(self) -> tuple[str, str, list]:
            return _where()

        def lock_where(self, timeout: float) -> tuple[str, str, list]:
            return ray.get(self.lock.where.remote(), timeout=timeout)

    return TrainActor, EngineActor, RolloutManager


def place(ray, args: argparse.Namespace, layout: dict, placement: dict, result: dict,
          errors: list[str]) -> Placed | None:
    """Connect to the cluster and place what Miles places: the group, a probe actor in each bundle (where each
    bundle is), the trainer (and critic) ranks, one actor per node of each engine, the RolloutManager and its engine
    lock. None when nothing more can be checked (``errors`` and ``result`` say why)."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"  # never start a new cluster
    if address.startswith(("http://", "https://")):
        address = "auto"  # a dashboard URL is for the Jobs API; inside a job "auto" finds the GCS
    ray.init(address=address, logging_level="WARNING", log_to_driver=True)
    TrainActor, EngineActor, RolloutManager = _actor_classes(ray)

    nodes_now = [nd for nd in ray.nodes() if nd.get("Alive")]
    head = next((nd for nd in nodes_now if "node:__internal_head__" in (nd.get("Resources") or {})), None)
    manager_options: dict = {}
    if args.pin_rollout_manager_to_head:
        if head is None:
            errors.append("--pin-rollout-manager-to-head: Ray reports no head node")
            return None
        manager_options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=head["NodeID"], soft=False)
    result["head_node"] = head.get("NodeManagerAddress") if head else None

    n = layout["bundles"]
    pg = None
    where: list = []
    t0 = time.monotonic()
    if n > 0:
        pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(n)], strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=args.timeout)
        result["seconds_placement"] = round(time.monotonic() - t0, 2)
        if not ready:
            msg, fields = _not_ready(ray, args, n)
            errors.append(msg.splitlines()[0])
            print(f"ERROR: {msg}", flush=True)
            result.update(fields)
            remove_placement_group(pg)
            return None

    # ---- probe: one actor per bundle reports node IP, node id and GPU id ----------------------
    t1 = time.monotonic()

    def in_bundle(cls, i: int):
        return cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        ).remote()

    probes = [in_bundle(TrainActor, i) for i in range(n)]
    manager = RolloutManager.options(**manager_options).remote()
    try:
        where = ray.get([p.where.remote() for p in probes], timeout=args.actor_timeout)
    except Exception as exc:  # GetTimeoutError, actor died
        errors.append(f"bundle actors did not start within {args.actor_timeout:g}s: {type(exc).__name__}: {exc}")
        return None
    infos = [(i, where[i][0], where[i][2][0] if where[i][2] else -1) for i in range(n)]
    order = [i for i, _, _ in sorted(infos, key=sort_key)]  # logical index -> actual bundle index
    ip_of = {i: where[i][0] for i in range(n)}
    node_of = {i: where[i][1] for i in range(n)}
    gpu_of = {i: infos[i][2] for i in range(n)}

    # the group table must agree with where the actors say they are
    try:
        table = ray.util.placement_group_table(pg).get("bundles_to_node_id", {}) if pg is not None else {}
        for i in range(n):
            if table and table.get(i) not in (None, node_of[i]):
                errors.append(f"bundle {i}: actor runs on {node_of[i][:8]} but the group put it on {table[i][:8]}")
    except Exception:  # noqa: BLE001
        pass
    per_node_gpus: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        per_node_gpus[node_of[i]].append(gpu_of[i])
    for nid, ids in per_node_gpus.items():
        dup = [x for x, c in Counter(ids).items() if c > 1]
        if dup or -1 in ids:
            errors.append(f"node {nid[:8]}: bundles share or lack GPU ids {sorted(ids)}")

    trainer = [order[s] for s in placement["trainer"]]  # rank -> actual bundle
    for i in set(range(n)) - set(trainer):  # the other probes were only probes (Miles kills its InfoActors)
        ray.kill(probes[i])
    train_actors = [probes[i] for i in trainer]
    critic_actors = [in_bundle(TrainActor, order[s]) for s in placement["critic"]]

    # ---- engines: one actor per node of each engine, on its first bundle on that node ----------
    engine_plan = placement["engine_actors"]
    engine_actors = [in_bundle(EngineActor, order[ea["first"]]) for ea in engine_plan]
    engine_where, train_where, critic_where, manager_where, lock_where = [], [], [], None, None
    try:
        engine_where = ray.get([x.where.remote() for x in engine_actors], timeout=args.actor_timeout)
        train_where = ray.get([x.where.remote() for x in train_actors], timeout=args.actor_timeout)
        critic_where = ray.get([x.where.remote() for x in critic_actors], timeout=args.actor_timeout)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"train/critic/engine actors did not start: {type(exc).__name__}: {exc}")
    bound = max(args.timeout, 120.0)  # both were created before the other actors: this is only a backstop
    try:
        manager_where = ray.get(manager.where.remote(), timeout=bound)
        lock_where = ray.get(manager.lock_where.remote(bound), timeout=bound + 10)
    except Exception as exc:  # noqa: BLE001 — GetTimeoutError: no free CPU outside the group
        errors.append(
            f"the RolloutManager{' (pinned to the head)' if args.pin_rollout_manager_to_head else ''} and its engine "
            f"lock (1 CPU each, outside the GPU bundles) were not placed within {bound:g}s "
            f"({type(exc).__name__}): the cluster needs 2 CPUs besides the bundles' ones")
    result["seconds_actors"] = round(time.monotonic() - t1, 2)
    result["actors"] = {"train": len(train_actors), "critic": len(critic_actors), "engine": len(engine_actors),
                        "rollout_manager": 1, "engine_lock": 1}
    return Placed(pg=pg, n=n, head=head, order=order, ip_of=ip_of, node_of=node_of, gpu_of=gpu_of,
                  per_node_gpus=per_node_gpus, trainer=trainer, engine_plan=engine_plan, train_actors=train_actors,
                  critic_actors=critic_actors, engine_actors=engine_actors, manager=manager,
                  engine_where=engine_where, train_where=train_where, critic_where=critic_where,
                  manager_where=manager_where, lock_where=lock_where)


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
    cluster = {r["node_id"]: r for r in _free_per_node(ray)}
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
    print(_fmt_table(rows, ["node", "id", "GPUs", "bundles", "trainer", "rollout", "eval", "engine actors"]),
          flush=True)
    by_node: dict[str, list[int]] = defaultdict(list)
    for t in trainer_ranks:
        by_node[t["node"]].append(t["rank"])
    for ip, rs in by_node.items():
        gpus = [trainer_ranks[x]["gpu"] for x in rs]
        print(f"trainer ranks {_ranges(rs)} on {ip} GPUs {_ranges(gpus) if gpus == sorted(gpus) else gpus}",
              flush=True)
    on_one_node: dict[tuple[str, str], list[int]] = defaultdict(list)
    for eng in engines.values():
        if len(eng["nodes"]) == 1:
            on_one_node[(eng["group"], eng["nodes"][0])].append(eng["engine"])
        else:
            print(f"{eng['group']} engine {eng['engine']} spans {len(eng['nodes'])} nodes ({', '.join(eng['nodes'])}): "
                  "one actor per node", flush=True)
    for (group, ip), ks in on_one_node.items():
        print(f"{group} engine{'s' if len(ks) > 1 else ''} {_ranges(ks)} on {ip}", flush=True)
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


def release(ray, args: argparse.Namespace, placed: Placed, result: dict, errors: list[str]) -> None:
    """Hold every placed actor for ``--hold`` seconds (when every check passed), then kill them and remove the
    group."""
    from ray.util.placement_group import remove_placement_group

    p = placed
    named = [(f"trainer rank {j}", a) for j, a in enumerate(p.train_actors)]
    named += [(f"critic rank {j}", a) for j, a in enumerate(p.critic_actors)]
    named += [(f"{ea['group']} engine {ea['engine']} actor {ea['node_of_engine']}", a)
              for ea, a in zip(p.engine_plan, p.engine_actors, strict=True)]
    named += [("RolloutManager", p.manager)]
    if args.hold > 0 and not errors:
        errors.extend(_hold(ray, args.hold, named))
        result.update(ok=not errors, errors=errors)
    for _, actor in named:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001
            pass
    if p.pg is not None:
        remove_placement_group(p.pg)


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
