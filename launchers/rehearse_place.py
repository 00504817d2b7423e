"""The rehearsal's placing (part of ``rehearse.py``, shipped beside it): the actors with Miles's shapes, the
placement group and each actor in it, why a group is not ready, and holding then releasing what was placed.
Imports ray only through the ``ray`` its callers pass."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter, defaultdict
from types import SimpleNamespace

try:  # imported as the miles_ray.launchers package (the tests)
    from .rehearse_plan import sort_key
except ImportError:  # run as the job's script: its siblings are shipped beside it in the working_dir
    from rehearse_plan import sort_key  # type: ignore[no-redef]

ACTOR_SHAPE = {"train": 0.4, "engine": 0.2}  # GPU (and CPU) of one actor in its bundle, as Miles asks


def fmt_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def free_per_node(ray) -> list[dict]:
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


def _not_ready(ray, args, n: int) -> tuple[str, dict]:
    """Why a group of ``n`` bundles is not ready: the numbers, a per-node table, and the result fields."""
    nodes = free_per_node(ray)
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
    table = fmt_table(
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


