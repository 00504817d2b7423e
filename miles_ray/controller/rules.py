"""The run controller's rules, standard library only (shipped beside the supervisor program; the CLI uses them
too): when a job is lost with its head, which GPU workers count, and the attempt ledger (attempt ids, the restart
budget, the run's latest complete checkpoint)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

MAX_RESTARTS_LIMIT = 100
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron writes it once a checkpoint is complete


class SpecError(ValueError):
    """A supervisor spec (or a flag of one) that cannot be used: what is wrong, in one line."""


# -- the attempt ledger ------------------------------------------------------------------------------------------

def check_max_restarts(value: Any) -> None:
    """``--max-restarts`` / the spec's ``max_restarts``: an integer 0..:data:`MAX_RESTARTS_LIMIT`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"max_restarts {value!r} is not an integer")
    if value < 0 or value > MAX_RESTARTS_LIMIT:
        raise SpecError(f"--max-restarts {value} is out of range: 0 (not supervised) to {MAX_RESTARTS_LIMIT}")


def attempt_submission_id(base: str, attempt: int) -> str:
    """The Ray submission id of a run's attempt: the run's own for the first, ``<it>-a<N>`` for attempt N (a head
    that came back keeps the dead job under the old id)."""
    return base if attempt <= 1 else f"{base}-a{attempt}"


def attempt_of(base: str, submission_id: str) -> int | None:
    """Which attempt of the run ``base`` the job ``submission_id`` is (None: not one of the run's)."""
    if submission_id == base:
        return 1
    m = re.fullmatch(re.escape(base) + r"-a(\d+)", submission_id or "")
    return int(m.group(1)) if m and int(m.group(1)) >= 2 else None


def read_latest_iteration(text: str | None) -> int | None:
    """The iteration in Megatron's ``latest_checkpointed_iteration.txt`` (None: unreadable; ``release``: 0)."""
    t = (text or "").strip()
    if t == "release":
        return 0
    return int(t) if t.isdigit() else None


def latest_iteration(checkpoint_dir: str | None) -> int | None:
    """The run's latest complete checkpoint, where this process can read its dir (None: none, or not here)."""
    if not checkpoint_dir:
        return None
    try:
        with open(os.path.join(checkpoint_dir, TRACKER), encoding="utf-8") as fh:
            return read_latest_iteration(fh.read())
    except OSError:
        return None


def checkpoint_step(latest: int | None, resumed: int | None) -> int | None:
    """The last rollout id an attempt trained, as the run's checkpoints prove it (when its logs could not be read):
    ``latest`` (the tracker's iteration now) is that rollout (Miles' numbering: iteration N holds rollout N trained,
    0 included), when newer than ``resumed`` (the tracker's iteration when the attempt started; None: there was
    none). None when the checkpoints prove nothing the attempt did."""
    if latest is None or (resumed is not None and latest <= resumed):
        return None
    return latest


# -- the classifier and the decision ---------------------------------------------------------------------------

# (pattern, what it means): failures worth retrying -- the run's cluster lost a part, not the run's own fault
_RETRYABLE = (
    (r"head lost|failed to get job supervisor|Job supervisor actor (?:died|could not be scheduled)",
     "the Ray head (and the job's driver on it) was lost"),
    (r"NodeDiedError|node .{0,80}(?:died|is dead|was terminated|has been marked dead)|raylet .{0,40}died|"
     r"RayletDied|The node with node id .{0,80}(?:died|has been marked dead)", "a Ray node was lost"),
    (r"ActorDiedError|ActorUnavailableError|RayActorError|The actor died|actor .{0,60}died unexpectedly|"
     r"owner .{0,40}died|WorkerCrashedError|worker .{0,40}(?:died|exited unexpectedly)", "a Ray actor or worker died"),
    (r"Watchdog caught collective operation timeout|NCCL.{0,80}(?:timeout|timed out|Timeout)|"
     r"collective.{0,40}timed? ?out|ProcessGroupNCCL.{0,80}(?:error|Error)|NCCL communicator was aborted",
     "a collective (NCCL) timed out"),
    (r"OutOfMemoryError: .{0,40}(?:Task was killed|killed)|memory monitor|OOM[- ]kill|oom_kill|"
     r"Killed process|exit code 137|exit code -9|exited with code 137|signal 9|SIGKILL",
     "a process was killed (OOM killer or node loss: SIGKILL)"),
    (r"ConnectionError|Connection (?:refused|reset)|connection to the (?:head|GCS) .{0,20}lost|"
     r"Failed to connect to GCS|GCS .{0,40}(?:unavailable|timed out)|RpcError", "the connection to the head was lost"),
)


@dataclass(frozen=True)
class Verdict:
    """What ended an attempt: ``kind`` ``succeeded`` | ``stopped`` | ``retryable`` | ``failed``; ``reason``: one
    line (Ray's message, or what the classifier recognised)."""

    kind: str
    reason: str


def _tail(text: str | None, lines: int = 60) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def classify(status: str, message: str | None = None, logs: str | None = None, exit_code: int | None = None,
             lost: str | None = None) -> Verdict:
    """Why an attempt ended (``status``: Ray's job status; ``message``: its message; ``logs``: the attempt's logs
    (their tail is read); ``exit_code``: the driver's; ``lost``: the supervisor found the job lost with its head,
    and why)."""
    if status == "SUCCEEDED":
        return Verdict("succeeded", "the job succeeded")
    if status == "STOPPED":
        return Verdict("stopped", "the job was stopped ('miles-ray stop' or 'ray job stop')")
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    first = re.sub(r",? last available logs.*$", "", first)  # Ray's message goes on with the logs' tail
    if lost:
        return Verdict("retryable", f"the Ray head (and the job's driver on it) was lost: {lost}")
    if exit_code in (137, -9):
        return Verdict("retryable", f"the driver was killed (exit code {exit_code}: SIGKILL, the OOM killer or a "
                                    "lost node)" + (f"; {first}" if first else ""))
    text = f"{message or ''}\n{_tail(logs)}"
    for pattern, what in _RETRYABLE:
        m = re.search(pattern, text, re.I)
        if m:
            return Verdict("retryable", f"{what} ({m.group(0).strip()[:120]})" + (f"; {first}" if first else ""))
    return Verdict("failed", first or f"the job {status.lower()}" + (
        f" (driver exit code {exit_code})" if exit_code is not None else ""))


@dataclass(frozen=True)
class Decision:
    retry: bool
    why: str


def decide(attempt: int, verdict: Verdict, step: int | None, previous_step: int | None,
           max_restarts: int) -> Decision:
    """Whether to start attempt ``attempt + 1`` after ``attempt`` ended with ``verdict`` (``step``: its last
    training step, None before the first; ``previous_step``: the previous attempt's, None: none, or it trained
    none). Never retried: a stop, a failure not known to be transient, a failure before the attempt's first step
    (bad flag, missing data, import error), a failure with no progress since the previous attempt, or once
    ``max_restarts`` restarts are spent."""
    if verdict.kind == "succeeded":
        return Decision(False, "the run succeeded")
    if verdict.kind == "stopped":
        return Decision(False, "stopped: a stopped run is never started again")
    if step is None:
        return Decision(False, "it failed before its first training step (a bad flag, missing data or an import "
                               "error fails the same way again)")
    if verdict.kind != "retryable":
        return Decision(False, "not a failure worth retrying (not a lost node, pod or head, a collective timeout, an "
                               "OOM kill or a lost connection)")
    if previous_step is not None and step <= previous_step:
        return Decision(False, f"no progress since the previous attempt (last step {step}, the previous attempt's "
                               f"{previous_step})")
    if attempt > max_restarts:
        return Decision(False, f"the restart budget is spent (--max-restarts {max_restarts}, {attempt} attempt(s))")
    return Decision(True, f"{verdict.reason.split(' (')[0]}; progress to step {step}: restart "
                          f"{attempt} of {max_restarts}")


# -- the head-loss rule ------------------------------------------------------------------------------------------

def head_of(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ALIVE head node (``node_id``, ``start_time_ms``: Ray gives it with ``detail=true``) and the ids of every
    ALIVE node (``alive``), from Ray's node rows."""
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    head = next((n for n in alive if n.get("is_head_node")), None) or {}
    return {"node_id": head.get("node_id"), "start_time_ms": head.get("start_time_ms"),
            "alive": {n.get("node_id") for n in alive if n.get("node_id")}}


def lost_with_head(job: Mapping[str, Any], head: Mapping[str, Any], attempt_head: str | None) -> str | None:
    """THE head-loss rule: why a PENDING/RUNNING job is lost (its driver ran on a head that is gone: Ray's job
    table, kept by GCS fault tolerance, still says RUNNING), None when it is not. Lost when its driver's node
    (``driver_node_id``) is not ALIVE and either the head changed since the attempt started (``attempt_head``: the
    head node id then) or the job started (``start_time``, ms) before the head serving now (``head``:
    :func:`head_of`). Not known while no head is ALIVE."""
    driver = job.get("driver_node_id")
    if driver and driver in head["alive"]:
        return None
    if not head.get("node_id"):
        return None
    if attempt_head and attempt_head != head["node_id"]:
        return f"Ray head node {attempt_head[:16]} is gone (the head now is {head['node_id'][:16]})"
    started, head_started = job.get("start_time"), head.get("start_time_ms")
    if started and head_started and started < head_started:
        return f"the job started before the head now serving ({head['node_id'][:16]}) and its driver runs nowhere"
    return None


# -- the GPU-workers-ready rule ----------------------------------------------------------------------------------

# A node whose pod (or raylet) is gone stays ALIVE in Ray until the GCS's health checks of its raylet fail: Ray says
# up to 30 s (NodeState.end_time_ms: "could be delayed up to 30 seconds").
NODE_DEATH_SECONDS = 30.0
POD_CLOCK_SLACK_MS = 1000  # a node started this much before its pod's creation time still counts (clocks)


def gpu_workers_ready(nodes: Iterable[Mapping[str, Any]], gpus_per_node: int, *,
                      pods: Mapping[str, float | None] | Iterable[str] | None = None,
                      suspect: Iterable[str] = ()) -> list[Mapping[str, Any]]:
    """THE rule of every wait for GPU workers (the CLI's and the supervisor's): the GPU workers in Ray that count,
    from Ray's node rows (``/api/v0/nodes``, with ``detail=true`` for ``start_time_ms``): ALIVE nodes with at least
    ``gpus_per_node`` GPUs (and some), without the nodes of pods that are gone -- Ray lists such a node ALIVE until
    its health checks fail (:data:`NODE_DEATH_SECONDS`), and it must never stand in for its replacement:

    - ``pods``, the worker pods that exist now (their IPs, or IP -> the pod's creation time in ms, None: not known):
      only nodes at their IPs, started after their pod (:data:`POD_CLOCK_SLACK_MS` allowed), and of two ALIVE at
      one pod's IP only the one that started last (the other started before that pod: its own pod is gone);
    - ``suspect``: ids of nodes that may be a lost pod's, for a caller with no view of the pods (the supervisor, for
      :data:`NODE_DEATH_SECONDS` after a node may have been lost): not counted."""
    made: Mapping[str, float | None] | None
    made = None if pods is None else pods if isinstance(pods, Mapping) else dict.fromkeys(pods)
    excluded = set(suspect)
    newest: dict[Any, Mapping[str, Any]] = {}
    for i, n in enumerate(nodes):
        gpus = float((n.get("resources_total") or {}).get("GPU", 0) or 0)
        if n.get("state") != "ALIVE" or gpus <= 0 or gpus < gpus_per_node or n.get("node_id") in excluded:
            continue
        ip = n.get("node_ip")
        if made is not None:
            if ip not in made:
                continue
            created, started = made[ip], n.get("start_time_ms")  # (None: not known, not judged)
            if created is not None and started is not None and started < created - POD_CLOCK_SLACK_MS:
                continue
        key = ip if made is not None and ip else i  # one raylet per pod (per IP)
        other = newest.get(key)
        if other is None or (n.get("start_time_ms") or 0) > (other.get("start_time_ms") or 0):
            newest[key] = n
    return list(newest.values())


def node_loss_possible(verdict: Any) -> bool:
    """Whether the attempt that ended with ``verdict`` (its ``kind`` and ``reason``) may have lost a GPU worker Ray
    still lists ALIVE (a node, a worker or actor, a collective, a connection): not when its driver itself was killed
    (it runs on the head: a lost worker makes it fail, not die) nor when the head itself was lost (its workers
    stay)."""
    return verdict.kind == "retryable" and not verdict.reason.startswith(
        ("the driver was killed", "the Ray head (and the job's driver on it) was lost"))
