"""Lifecycle of a local cluster: up, status, scale, down -- each under the cluster's file lock.

``up`` on a failure of any kind stops everything it started (node sessions and job drivers, by
PID), removes the temp dir and the state file, and raises one error line; only the failed node's
``ray start`` output is kept, at the path that line names.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from miles_ray.adapters.local_ray import nodes as ray_nodes
from miles_ray.adapters.local_ray import processes
from miles_ray.adapters.local_ray import state as store
from miles_ray.adapters.local_ray.nodes import HEAD_CPUS, OBJECT_STORE_BYTES, Progress, say
from miles_ray.core.errors import ClusterError, ConfigError, NotFound, TimedOut, Unreachable

HEAD_ATTEMPTS_WHEN_ALREADY_UP = 5
# When the head dies while workers start (its dashboard gone, see nodes.HeadLost), the whole cluster starts again
# once; every node keeps its own attempts (nodes.START_ATTEMPTS) within each try
CLUSTER_ATTEMPTS = 2


def _dashboard_log_tail(state: dict) -> str:
    """The last line of the head's dashboard log (why it went away, when it says so), or ''."""
    temp = state.get("temp_dir")
    text = processes.tail(Path(temp) / "session_latest" / "logs" / "dashboard.log", 40) if temp else ""
    return ray_nodes.last_line(text) if text.strip() else ""


# --------------------------------------------------------------------------------------------
# what a state records
# --------------------------------------------------------------------------------------------


def processes_of(state: dict) -> list[dict]:
    """Session records of every node ``up``/``scale`` started (workers, nodes still starting, head)."""
    recs = [*(state.get("workers") or []), *(state.get("starting") or []), state.get("head")]
    return [p for p in recs if p and p.get("pid")]


def job_sessions_of(state: dict) -> list[dict]:
    """Session records of the cluster's Ray Jobs drivers (they run outside the node sessions)."""
    head = state.get("head") or {}
    if not state.get("gcs_address") or not head.get("start_ticks"):
        return []
    own = {int(p["pid"]) for p in processes_of(state)}
    return processes.job_sessions(state["gcs_address"], int(head["start_ticks"]), exclude=own)


def live_pids(state: dict) -> list[int]:
    """Every live PID of the cluster: its node sessions and its job drivers."""
    return sorted({pid for rec in [*processes_of(state), *job_sessions_of(state)]
                   for pid in processes.session_members(rec)})


def _any_alive(state: dict) -> bool:
    return any(processes.session_members(p) for p in processes_of(state))


def _stop_everything(state: dict, grace: float) -> dict:
    return processes.stop_sessions(processes_of(state), job_sessions_of(state), grace=grace)


def _cleanup(state_dir: Path, name: str, state: dict, grace: float = processes.STOP_GRACE_SECONDS) -> dict:
    """Stop every process of the cluster, then remove its temp dir and state (kept if a process survived)."""
    result = _stop_everything(state, grace)
    if result["left"]:
        raise ClusterError(
            f"processes {result['left']} of local cluster {name!r} are still there after SIGKILL",
            hint=f"run `miles-ray down --backend local --name {name}` again",
        )
    store.remove_temp_dir(state.get("temp_dir"))
    store.remove_token(state_dir, name)
    store.remove_state(state_dir, name)
    return result


# --------------------------------------------------------------------------------------------
# up
# --------------------------------------------------------------------------------------------


def up(
    state_dir: Path,
    name: str,
    nodes: int,
    gpus_per_node: int = 8,
    cpus_per_node: int | None = None,
    progress: Progress = None,
    timeout: float = 300,
    head_cpus: int = HEAD_CPUS,
    auth: str = "token",
) -> dict:
    """Start head + ``nodes`` GPU worker raylets; return the cluster's status dict.

    ``auth``: ``token`` (default) gives the cluster a fresh random token, kept 0600 beside its state
    (:func:`~miles_ray.adapters.local_ray.state.token_path`); every node runs with ``RAY_AUTH_MODE=token``, so
    a request without it is refused (401/403). ``none`` starts it with ``RAY_AUTH_MODE=disabled``.

    Each node gets up to :data:`~miles_ray.adapters.local_ray.nodes.START_ATTEMPTS` attempts within
    ``timeout`` (seconds, for the whole cluster). An already-live cluster of that name is returned
    unchanged with ``already_running=True``. On any failure everything started here is stopped and
    the state removed.
    """
    store.check_name(name)
    cpus = gpus_per_node if cpus_per_node is None else cpus_per_node
    if nodes < 0 or gpus_per_node < 0:
        raise ConfigError("nodes and GPUs per node must be >= 0")
    if auth not in ("token", "none"):
        raise ConfigError(f"unknown Ray auth mode {auth!r}", hint="use token or none")
    if cpus < gpus_per_node or cpus < 1:
        raise ConfigError(
            f"each local node needs at least as many CPUs as GPUs (got {cpus} CPUs, {gpus_per_node} GPUs)",
            hint="Miles asks for one CPU with every GPU bundle",
        )
    state_dir = Path(state_dir)
    with store.locked(state_dir, name):
        old = store.read_state(state_dir, name)
        if old is not None:
            # a state still "starting" under our lock is what an `up` that died half-way left behind
            if old.get("phase") == "running" and _any_alive(old):
                if not head_answers(old, attempts=HEAD_ATTEMPTS_WHEN_ALREADY_UP):
                    raise Unreachable(
                        f"local cluster {name!r} has running processes but its head at "
                        f"{old['dashboard_url']} does not answer",
                        hint=f"stop it with `miles-ray down --backend local --name {name}`, then start again",
                    )
                out = status_from_state(old)
                out["already_running"] = True
                out["requested_nodes"] = nodes
                out["matches_request"] = out["gpu_node_count"] == nodes and old.get("gpus_per_node") == gpus_per_node
                return out
            say(progress, f"removing leftovers of a stopped or half-started local cluster {name!r}")
            _cleanup(state_dir, name, old)
        return _up_locked(state_dir, name, nodes, gpus_per_node, cpus, progress, timeout, head_cpus, auth)


def _up_locked(
    state_dir: Path, name: str, n_workers: int, gpus: int, cpus: int, progress: Progress, timeout: float, head_cpus: int,
    auth: str,
) -> dict:
    t0 = time.monotonic()
    deadline = t0 + timeout
    store.remove_failure_logs(state_dir, name)
    state: dict[str, Any] = {
        "version": 2,
        "backend": "local",
        "name": name,
        "phase": "starting",
        "dashboard_url": None,
        "gcs_address": None,
        "temp_dir": None,
        "gpus_per_node": gpus,
        "cpus_per_node": cpus,
        "head_cpus": head_cpus,
        "object_store_memory": OBJECT_STORE_BYTES,
        "auth": auth,
        "token_path": str(store.token_path(state_dir, name)) if auth == "token" else None,
        "ray_version": ray_nodes.ray_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_unix": time.time(),
        "head": None,
        "workers": [],
        "starting": [],
    }
    try:
        store.remove_token(state_dir, name)
        if auth == "token":
            store.new_token(state_dir, name)  # before the state names it, so a state never points at no file
        for restart in range(1, CLUSTER_ATTEMPTS + 1):
            ray_nodes.start_head(state, state_dir, name, deadline, progress)
            say(progress, f"head node ready after {time.monotonic() - t0:.1f}s")
            try:
                for index in range(1, n_workers + 1):
                    ray_nodes.start_worker(state, index, state_dir, name, deadline, progress, total=n_workers)
                break
            except ray_nodes.HeadLost as exc:
                why = f"the head node stopped answering while worker node {index} started ({exc.reason})"
                log = _dashboard_log_tail(state)
                if restart == CLUSTER_ATTEMPTS or deadline - time.monotonic() < ray_nodes.MIN_RETRY_SECONDS * 2:
                    raise ClusterError(why + (f"; the head's dashboard log ends: {log}" if log else "")) from None
                say(progress, f"{why}; stopping the cluster and starting it again "
                              f"(attempt {restart + 1}/{CLUSTER_ATTEMPTS})" + (f"; its dashboard log ends: {log}"
                                                                               if log else ""))
                _stop_everything(state, grace=5)
                store.remove_temp_dir(state.get("temp_dir"))
                state.update(temp_dir=None, head=None, workers=[], starting=[], dashboard_url=None, gcs_address=None)
                store.write_state(state_dir, name, state)
        try:
            ray_nodes.poll_nodes(
                lambda ns: ray_nodes.topology_ok(ns, n_workers, gpus),
                state["dashboard_url"],
                max(10.0, deadline - time.monotonic()),
                watched=state["head"],
            )
        except ray_nodes.NodeDidNotStart as exc:
            raise TimedOut(f"local cluster {name!r} did not show 1 head + {n_workers} GPU nodes: {exc.reason}") from None
        state["phase"] = "running"
        state["up_seconds"] = round(time.monotonic() - t0, 2)
        store.write_state(state_dir, name, state)
    except BaseException as exc:
        say(progress, "start failed; stopping what was started")
        result = _stop_everything(state, grace=5)
        store.remove_temp_dir(state.get("temp_dir"))
        store.remove_token(state_dir, name)
        store.remove_state(state_dir, name)
        if result["left"]:
            say(progress, f"warning: processes {result['left']} did not go away after SIGKILL")
        if isinstance(exc, ClusterError | KeyboardInterrupt):
            raise
        raise ClusterError(f"could not start local Ray cluster {name!r}: {exc}") from exc
    out = status_from_state(state)
    out["already_running"] = False
    out["up_seconds"] = state["up_seconds"]
    return out


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------


def head_answers(state: dict, attempts: int = 1) -> bool:
    """The head's state API lists an ALIVE head node (retried: a busy machine answers slowly)."""
    for attempt in range(attempts):
        try:
            rows = ray_nodes.fetch_nodes(state["dashboard_url"], timeout=ray_nodes.HTTP_TIMEOUT_SECONDS)
            if any(n.get("is_head_node") for n in ray_nodes.alive(rows)):
                return True
        except ray_nodes.NOT_READY_ERRORS:
            pass
        if attempt + 1 < attempts:
            time.sleep(1.0)
    return False


def _head_is_live(state: dict) -> bool:
    head = state.get("head")
    return bool(head) and processes.leader_alive(head) and head_answers(state, attempts=3)


def _describe(node: dict) -> dict:
    res = node.get("resources_total") or {}
    return {
        "node_id": node.get("node_id"),
        "ip": node.get("node_ip"),
        "node_ip": node.get("node_ip"),
        "is_head": bool(node.get("is_head_node")),
        "state": node.get("state"),
        "index": 0 if node.get("is_head_node") else ray_nodes.node_index(node),
        "gpus": float(res.get("GPU", 0)),
        "cpus": float(res.get("CPU", 0)),
    }


def status_from_state(state: dict, rows: list[dict] | None = None) -> dict:
    """The status dict of a recorded cluster, from its head's state API (or the given node rows)."""
    if rows is None:
        try:
            rows = ray_nodes.fetch_nodes(state["dashboard_url"], timeout=ray_nodes.HTTP_TIMEOUT_SECONDS)
        except ray_nodes.NOT_READY_ERRORS as exc:
            raise Unreachable(
                f"the head of local cluster {state['name']!r} at {state['dashboard_url']} is unreachable ({exc})",
                hint=f"run `miles-ray down --backend local --name {state['name']}` and `miles-ray up` again",
            ) from exc
    described = [_describe(n) for n in rows]
    live = [n for n in described if n["state"] == "ALIVE"]
    dead = [n for n in described if n["state"] != "ALIVE"]
    workers = state.get("workers") or []
    pid_alive = {w["index"]: processes.leader_alive(w) for w in workers}
    for n in live:
        if n["index"] in pid_alive:
            n["process_alive"] = pid_alive[n["index"]]
    gpu_nodes = [n for n in live if n["gpus"] > 0]
    return {
        "name": state["name"],
        "backend": "local",
        "dashboard_url": state["dashboard_url"],
        "address": state["dashboard_url"],
        "gcs_address": state["gcs_address"],
        "temp_dir": state["temp_dir"],
        "ray_version": state.get("ray_version"),
        "auth": state.get("auth", "none"),
        "created": state.get("created"),
        "gpus_per_node": state.get("gpus_per_node"),
        "cpus_per_node": state.get("cpus_per_node"),
        "nodes": sorted(live, key=lambda n: (not n["is_head"], n["index"] or 0)),
        "dead_nodes": dead,
        "alive_count": len(live),
        "dead_count": len(dead),
        "gpu_node_count": len(gpu_nodes),
        "total_gpus": sum(n["gpus"] for n in live),
        "total_cpus": sum(n["cpus"] for n in live),
        "head_pid": (state.get("head") or {}).get("pid"),
        "worker_pids": {str(w["index"]): w["pid"] for w in workers},
    }


def _no_cluster(name: str) -> NotFound:
    return NotFound(f"no local cluster named {name} is running", hint="start one with `miles-ray up --backend local`")


def status(state_dir: Path, name: str) -> dict:
    """Alive/dead nodes, per-node GPUs/CPUs, totals, dashboard URL of a local cluster."""
    store.check_name(name)
    state = store.read_state(Path(state_dir), name)
    if state is None:
        raise _no_cluster(name)
    return status_from_state(state)


# --------------------------------------------------------------------------------------------
# scale, down
# --------------------------------------------------------------------------------------------


def scale(state_dir: Path, name: str, nodes: int, progress: Progress = None, timeout: float = 120) -> dict:
    """Grow (new workers, one at a time, each with retries) or shrink (stop the highest-index workers by PID)."""
    store.check_name(name)
    if nodes < 0:
        raise ConfigError("nodes must be >= 0")
    state_dir = Path(state_dir)
    with store.locked(state_dir, name):
        state = store.read_state(state_dir, name)
        if state is None or not _any_alive(state):
            raise _no_cluster(name)
        if not _head_is_live(state):
            raise Unreachable(
                f"the head of local cluster {name!r} at {state['dashboard_url']} does not answer",
                hint=f"`miles-ray down --backend local --name {name}` and start again",
            )
        t0 = time.monotonic()
        deadline = t0 + timeout
        state["workers"] = sorted(state.get("workers") or [], key=lambda w: w["index"])
        added, removed = [], []
        while len(state["workers"]) < nodes:
            index = (state["workers"][-1]["index"] if state["workers"] else 0) + 1
            try:
                ray_nodes.start_worker(state, index, state_dir, name, deadline, progress)
            except ray_nodes.HeadLost as exc:
                raise Unreachable(f"the head of local cluster {name!r} stopped answering while worker node {index} "
                                  f"started ({exc.reason})",
                                  hint=f"`miles-ray down --backend local --name {name}` and start again") from None
            added.append(index)
        while len(state["workers"]) > nodes:
            victim = state["workers"][-1]
            say(progress, f"removing worker node {victim['index']} (pid {victim['pid']})")
            processes.stop_sessions([victim])
            state["workers"] = state["workers"][:-1]
            store.write_state(state_dir, name, state)
            node_id = victim.get("node_id")
            try:
                ray_nodes.poll_nodes(
                    lambda ns, nid=node_id: all(n.get("node_id") != nid for n in ray_nodes.alive(ns)),
                    state["dashboard_url"],
                    max(10.0, deadline - time.monotonic()),
                )
            except ray_nodes.NodeDidNotStart as exc:
                raise TimedOut(f"worker node {victim['index']} is still listed ALIVE: {exc.reason}") from None
            removed.append(victim["index"])
        out = status_from_state(state)
        out.update({"added": added, "removed": removed, "scale_seconds": round(time.monotonic() - t0, 2)})
        return out


def down(state_dir: Path, name: str, grace: float = processes.STOP_GRACE_SECONDS) -> dict:
    """Stop exactly what ``up``/``scale`` started -- node sessions and job drivers, by PID -- and remove
    the state and temp dir."""
    store.check_name(name)
    state_dir = Path(state_dir)
    with store.locked(state_dir, name):
        state = store.read_state(state_dir, name)
        if state is None:
            raise _no_cluster(name)
        live = [p for p in processes_of(state) if processes.session_members(p)]
        result = _cleanup(state_dir, name, state, grace=grace)
        if not live and not result["pids"]:
            raise NotFound(f"no local cluster named {name} is running",
                           hint="removed the state of a cluster that had stopped")
        result.update({"name": name, "stopped_nodes": len(live), "temp_dir": state.get("temp_dir")})
        return result


def cluster_pids(state_dir: Path, name: str) -> list[int]:
    """Every live PID of the cluster -- node sessions and job drivers (for memory accounting and tests)."""
    state = store.read_state(Path(state_dir), name)
    return live_pids(state) if state is not None else []
