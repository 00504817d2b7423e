"""Nodes of a local cluster: how each is started, how we know it is ready, and retrying one that is not.

Layout (measured on a 2-core box, Ray 2.60):

* head: ``--num-gpus=0`` and a couple of CPUs (room for the job driver and a RolloutManager-like
  1-CPU actor), node IP ``127.0.0.2``, dashboard/Jobs API on ``http://127.0.0.1:<8265 or free>``;
* worker ``i`` (1-based): ``--num-gpus=G --num-cpus=C`` (C >= G), node IP ``127.0.0.<2+i>`` and a
  custom resource ``miles_ray_node_<i>: 1`` that identifies it.

Why one loopback address per node: ``127.0.0.1`` is rewritten by Ray to the machine's external
address, any other ``127.x.y.z`` is kept (every one of them is on ``lo``). Distinct addresses make
Miles's bundle sort -- by (node IP, GPU id) -- group bundles by node, as on a real cluster.

Workers are started ONE AT A TIME (parallel starts race on socket names in the shared temp dir).

A busy machine (load far above its cores, memory and disk under pressure) slows every Ray process
down, and some of Ray's start-up waits are too tight for that: they are raised in :data:`RAY_ENV`.
One is not configurable: ``ray start`` gives up when its raylet has not registered with the GCS
within 30 s. So each node gets up to :data:`START_ATTEMPTS` attempts with a backoff: a node that did
not come up is stopped by PID (its whole session), its leftovers are removed, and it is started
again. Readiness is judged from the state API (``/api/v0/nodes``): a dashboard that answers 5xx or
times out is "not ready yet"; only the node's ``ray start`` exiting, or the attempt's time running
out, fails an attempt. Each attempt names its node (``--node-name``), so a failed attempt's node,
still listed as ALIVE for a few seconds, is never taken for the new one.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from miles_ray.adapters import ray_auth
from miles_ray.adapters.local_ray import ports, processes
from miles_ray.adapters.local_ray import state as store
from miles_ray.adapters.local_ray.ray_start import (  # (the constants and RAY_ENV: this package's users read them here)
    HEAD_CPUS, HEAD_IP, HEAD_RESOURCE, NODE_RESOURCE_PREFIX, OBJECT_STORE_BYTES, RAY_ENV, child_env, head_args, node_ip,
    ray_version, worker_args)
from miles_ray.controller import ray_http
from miles_ray.core.errors import ClusterError, TimedOut
from miles_ray.core.progress import Progress



START_ATTEMPTS = 3
RETRY_BACKOFF_SECONDS = (2.0, 5.0)  # before the 2nd and the 3rd attempt
MIN_RETRY_SECONDS = 30.0  # no retry when less than this would be left for it (it could not finish)
# An attempt that is neither ready nor failed by then is stopped and retried. Longer than Ray's own
# start-up waits below (a slow node that is still making progress is worth waiting for: a restart
# repeats all its work); the normal failure signal is `ray start` exiting with its own message.
HEAD_ATTEMPT_SECONDS = 300.0
WORKER_ATTEMPT_SECONDS = 240.0
HTTP_TIMEOUT_SECONDS = 10.0  # one state-API request; a slow answer is "not ready yet"
POLL_SECONDS = 0.5

# A worker's start is judged through the head's dashboard: when that refuses connections (nothing listens on its
# port any more) for this long, the head is gone, and restarting the worker cannot help (:class:`HeadLost`). A
# head whose own `ray start --block` has exited is gone at once (:func:`poll_nodes` ``head``); this bound covers
# the rest: a caller that passes no head record, and refusals while the head's `ray start` still runs
HEAD_GONE_SECONDS = 30.0
# The dashboard port answering 401/403 to this cluster's own token: another cluster's dashboard took the port
# between our check that it was free and our head binding it (two clusters starting at once). Waiting cannot
# help; a new attempt picks new ports.
FOREIGN_DASHBOARD_SECONDS = 5.0


class NodeDidNotStart(Exception):
    """One start attempt of a node failed (its ``ray start`` exited, or it was not ready in time)."""

    def __init__(self, reason: str, timed_out: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


class HeadLost(Exception):
    """The head stopped answering while a worker started: the cluster, not the worker, has to start again."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _foreign(exc: BaseException) -> int | None:
    """The HTTP status when the dashboard refused this cluster's token (401/403), else None."""
    return exc.status if isinstance(exc, ray_http.Refused) else None


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ray_http.Unreachable) and exc.refused


def say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


# --------------------------------------------------------------------------------------------
# what the dashboard says
# --------------------------------------------------------------------------------------------

NOT_READY_ERRORS = (ray_http.HeadError,)


def fetch_nodes(dashboard_url: str, timeout: float = 5.0) -> list[dict]:
    """All nodes (ALIVE and DEAD) from the state API."""
    return ray_http.RayHead(dashboard_url, headers=ray_auth.headers(dashboard_url)).nodes(detail=False,
                                                                                          timeout=timeout)


def jobs_api_answers(dashboard_url: str, timeout: float = 5.0) -> bool:
    """The Jobs API answers 200: the dashboard's job module is loaded."""
    return ray_http.RayHead(dashboard_url, headers=ray_auth.headers(dashboard_url)).jobs_api_answers(timeout)


def alive(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n.get("state") == "ALIVE"]


def node_index(node: dict) -> int | None:
    for key in node.get("resources_total") or {}:
        if key.startswith(NODE_RESOURCE_PREFIX):
            try:
                return int(key[len(NODE_RESOURCE_PREFIX) :])
            except ValueError:
                return None
    return None


def topology_ok(nodes: list[dict], n_workers: int, gpus: int) -> bool:
    """Exactly one ALIVE 0-GPU head and ``n_workers`` ALIVE workers of ``gpus`` GPUs each."""
    live = alive(nodes)
    heads = [n for n in live if n.get("is_head_node")]
    workers = [n for n in live if not n.get("is_head_node")]
    gpu_ok = all(float((n.get("resources_total") or {}).get("GPU", 0)) == gpus for n in workers)
    head_gpus = sum(float((n.get("resources_total") or {}).get("GPU", 0)) for n in heads)
    return len(heads) == 1 and head_gpus == 0 and len(workers) == n_workers and gpu_ok


def _seconds(s: float) -> str:
    return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"


def poll_nodes(
    check: Callable[[list[dict]], Any],
    dashboard_url: str,
    budget: float,
    watched: dict | None = None,
    head_gone_after: float | None = None,
    head: dict | None = None,
) -> Any:
    """Poll the state API until ``check(nodes)`` is truthy and return it.

    Raises :class:`NodeDidNotStart` when ``watched`` (a node's ``ray start``) exits or ``budget``
    runs out. Errors and slow answers from the dashboard only mean "not ready yet", except, with
    ``head_gone_after``, connections refused for that many seconds in a row: :class:`HeadLost`, and
    401/403 to this cluster's token for :data:`FOREIGN_DASHBOARD_SECONDS` (another cluster's dashboard on the
    port): :class:`NodeDidNotStart` at once, so the next attempt picks new ports. With ``head`` (the head
    node's process record), the head's ``ray start --block`` having exited is :class:`HeadLost` at once: it
    exits, taking the head's other processes with it, within a second of any of them dying (its dashboard
    too), so there is nothing to wait for.
    """
    deadline = time.monotonic() + budget
    last_err = ""
    refused_since: float | None = None
    foreign_since: float | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            got = check(fetch_nodes(dashboard_url, timeout=max(1.0, min(HTTP_TIMEOUT_SECONDS, left))))
            refused_since = foreign_since = None
            if got:
                return got
        except NOT_READY_ERRORS as exc:
            last_err = f"{type(exc).__name__}: {exc}"
            code = _foreign(exc)
            if code is None:
                foreign_since = None
            elif foreign_since is None:
                foreign_since = time.monotonic()
            elif time.monotonic() - foreign_since >= FOREIGN_DASHBOARD_SECONDS:
                raise NodeDidNotStart(
                    f"{dashboard_url} answers HTTP {code} to this cluster's token: another Ray cluster's dashboard "
                    "holds that port (taken while this node started)", timed_out=False) from None
            if not _refused(exc):
                refused_since = None
            elif refused_since is None:
                refused_since = time.monotonic()
            elif head_gone_after is not None and time.monotonic() - refused_since >= head_gone_after:
                raise HeadLost(f"its dashboard at {dashboard_url} has refused connections for "
                               f"{_seconds(time.monotonic() - refused_since)}") from None
        if head is not None and processes.exited(head):
            raise HeadLost(f"the head node's `ray start` (PID {head['pid']}) has exited"
                           + (f", its dashboard at {dashboard_url} refusing connections" if refused_since is not None
                              else "")) from None
        if watched is not None and processes.exited(watched):
            popen = watched.get("_popen")
            code = popen.returncode if popen is not None else None
            raise NodeDidNotStart(
                f"`ray start` exited{f' with code {code}' if code is not None else ''}: "
                + last_line(processes.tail(watched["log"], 40)),
                timed_out=False,
            )
        if time.monotonic() >= deadline:
            raise NodeDidNotStart(
                f"not ready within {_seconds(budget)}" + (f" (dashboard: {last_err[:160]})" if last_err else ""),
                timed_out=True,
            )
        time.sleep(POLL_SECONDS)


def last_line(text: str) -> str:
    """The last line of a ``ray start`` log worth quoting (the error, not a blank or a ruler)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("-=~ ")]
    return (lines[-1][:240] if lines else "no output")


# --------------------------------------------------------------------------------------------
# starting one node, with retries
# --------------------------------------------------------------------------------------------


def start_head(state: dict, state_dir: Path, name: str, deadline: float, progress: Progress) -> None:
    """Start the head (new temp dir and ports on every attempt); fills ``state`` and writes it as it goes."""
    cpus = int(state["head_cpus"])

    def attempt(n: int, budget: float) -> None:
        state["temp_dir"] = store.new_temp_dir(state_dir, name)
        taken: set[int] = set()
        dash = ports.pick_port(taken, preferred=ports.PREFERRED_DASHBOARD_PORT)
        gcs = ports.pick_port(taken)
        client = ports.pick_port(taken)
        url = f"http://127.0.0.1:{dash}"
        state.update(dashboard_url=url, gcs_address=f"{HEAD_IP}:{gcs}", head=None)
        store.remember_token(state)
        node_name = new_node_name(name, "head")
        say(progress, f"starting head node {HEAD_IP} (GCS {state['gcs_address']}, dashboard {url})" + _nth(n))

        def on_spawn(record: dict) -> None:
            state["head"] = processes.public(record)
            store.write_state(state_dir, name, state)  # PIDs are on disk before anything else can go wrong

        def ready(nodes: list[dict]) -> dict | None:
            row = next((x for x in alive(nodes) if x.get("is_head_node") and x.get("node_name") == node_name), None)
            return row if row is not None and jobs_api_answers(url) else None

        _, row = attempt_node(
            head_args(state, node_name, gcs, dash, client), Path(state["temp_dir"]) / "logs" / "head.log", ready, url,
            budget, child_env(state), on_spawn, lambda rec, off, why: keep_failure_log(state_dir, name, "head", rec, off, n, why),
        )
        state["head"].update(ip=HEAD_IP, node_id=row.get("node_id"), node_name=node_name, gpus=0, cpus=cpus)
        store.write_state(state_dir, name, state)

    def clean() -> None:
        store.remove_temp_dir(state.get("temp_dir"))
        state.update(temp_dir=None, head=None)
        store.write_state(state_dir, name, state)

    _start_with_retries("head node", "head", HEAD_IP, HEAD_ATTEMPT_SECONDS, attempt, clean,
                        state_dir, name, deadline, progress)


def start_worker(
    state: dict, index: int, state_dir: Path, name: str, deadline: float, progress: Progress, total: int | None = None
) -> dict:
    """Start worker ``index`` and wait until it is ALIVE with its GPUs; append it to ``state["workers"]``.

    While it starts its record is in ``state["starting"]`` (on disk), so ``down`` finds it even if
    this process dies meanwhile.
    """
    g, c, ip, stem = int(state["gpus_per_node"]), int(state["cpus_per_node"]), node_ip(index), f"worker-{index}"
    counted = f"{index}/{total}" if total else str(index)

    def drop_starting(record: dict) -> None:
        state["starting"] = [p for p in state.get("starting") or [] if p["pid"] != record["pid"]]

    def attempt(n: int, budget: float) -> dict:
        node_name = new_node_name(name, stem)
        say(progress, f"starting worker node {counted} ({ip}, {g} GPUs, {c} CPUs)" + _nth(n))

        def on_spawn(record: dict) -> None:
            state.setdefault("starting", []).append({**processes.public(record), "index": index})
            store.write_state(state_dir, name, state)

        def failed(record: dict, offset: int, why: str) -> None:
            keep_failure_log(state_dir, name, stem, record, offset, n, why)
            drop_starting(record)
            store.write_state(state_dir, name, state)

        def ready(nodes: list[dict]) -> dict | None:
            return next(
                (x for x in alive(nodes)
                 if x.get("node_name") == node_name and float((x.get("resources_total") or {}).get("GPU", 0)) == g),
                None,
            )

        record, row = attempt_node(
            worker_args(state, index, node_name), Path(state["temp_dir"]) / "logs" / f"{stem}.log", ready,
            state["dashboard_url"], budget, child_env(state), on_spawn, failed, head_gone_after=HEAD_GONE_SECONDS,
            head=state.get("head"),
        )
        drop_starting(record)
        worker = {**processes.public(record), "index": index, "ip": ip, "node_id": row.get("node_id"),
                  "node_name": node_name, "gpus": g, "cpus": c}
        state.setdefault("workers", []).append(worker)
        store.write_state(state_dir, name, state)
        return worker

    return _start_with_retries(f"worker node {index}", stem, ip, WORKER_ATTEMPT_SECONDS, attempt, lambda: None,
                               state_dir, name, deadline, progress)


def _nth(attempt: int) -> str:
    return f", attempt {attempt}/{START_ATTEMPTS}" if attempt > 1 else ""


def _start_with_retries(
    label: str,
    stem: str,
    ip: str,
    attempt_seconds: float,
    attempt: Callable[[int, float], Any],
    clean: Callable[[], None],
    state_dir: Path,
    name: str,
    deadline: float,
    progress: Progress,
) -> Any:
    """Run ``attempt`` until the node is ready, at most :data:`START_ATTEMPTS` times within ``deadline``.

    A failed attempt has already been stopped by PID and its ``ray start`` output appended to the
    node's failure log (:func:`attempt_node`); ``clean`` removes its other leftovers, then the next
    attempt follows a backoff. After the last one: one error line naming the node, its IP and that log.
    """
    failure_log = store.failure_log_path(state_dir, name, stem)
    reason, timed_out, n = "", False, 0
    for n in range(1, START_ATTEMPTS + 1):
        budget = min(attempt_seconds, max(deadline - time.monotonic(), 0.1))
        try:
            return attempt(n, budget)
        except NodeDidNotStart as exc:
            reason, timed_out = exc.reason, exc.timed_out
            clean()
        backoff = RETRY_BACKOFF_SECONDS[min(n, len(RETRY_BACKOFF_SECONDS)) - 1]
        if n == START_ATTEMPTS or deadline - time.monotonic() < backoff + MIN_RETRY_SECONDS:
            break
        say(progress, f"{label} ({ip}) did not start (attempt {n}/{START_ATTEMPTS}: {reason}); "
                      f"stopped it, retrying in {backoff:.0f}s")
        time.sleep(backoff)
    error = TimedOut if timed_out else ClusterError
    raise error(f"local Ray {label} ({ip}) did not start after {n} attempt{'s' if n > 1 else ''}: {reason}; "
                f"log: {failure_log}")


def keep_failure_log(state_dir: Path, name: str, stem: str, record: dict, offset: int, attempt: int, reason: str) -> None:
    """Append what ``ray start`` printed in this attempt (from ``offset`` of its log) to the node's failure log."""
    path = store.failure_log_path(state_dir, name, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(record["log"], "rb") as fh:
            fh.seek(offset)
            body = fh.read()
    except OSError:
        body = b""
    with open(path, "ab") as out:
        out.write(f"=== {stem}, attempt {attempt}: {reason} ===\n".encode())
        out.write(body)
        if body and not body.endswith(b"\n"):
            out.write(b"\n")


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def attempt_node(
    args: list[str],
    log_path: Path,
    ready: Callable[[list[dict]], Any],
    dashboard_url: str,
    budget: float,
    env: dict[str, str],
    on_spawn: Callable[[dict], None],
    failed: Callable[[dict, int, str], None],
    head_gone_after: float | None = None,
    head: dict | None = None,
) -> tuple[dict, Any]:
    """Spawn one ``ray start`` and wait until ``ready``; on failure stop its session by PID, then re-raise.

    ``on_spawn(record)`` runs right after the spawn (its PID goes on disk before any wait);
    ``failed(record, log_offset, reason)`` runs once it is stopped.
    """
    offset = _log_size(log_path)
    record = processes.spawn_ray_start(args, log_path, env)
    try:
        on_spawn(record)
        got = poll_nodes(ready, dashboard_url, budget, watched=record, head_gone_after=head_gone_after, head=head)
    except NodeDidNotStart as exc:
        processes.stop_sessions([record], grace=3)
        failed(record, offset, exc.reason)
        raise
    except BaseException:
        processes.stop_sessions([record], grace=3)
        raise
    return record, got


def new_node_name(cluster: str, stem: str) -> str:
    """A name unique to one start attempt (``--node-name``), so readiness never matches an older attempt."""
    return f"{cluster}-{stem}-{secrets.token_hex(3)}"
