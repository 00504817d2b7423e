"""The embedded "local backend": a real multi-node Ray cluster on this machine.

Every node is its own ``ray start --block`` process, started in a new session (``setsid``), so
that node -- its raylet, agents and every Ray worker it forks -- can be found and stopped by
session id alone: never ``ray stop``, never by process name.

Layout (measured on a 2-core box, Ray 2.60):

* head: ``--num-gpus=0`` and a couple of CPUs (room for the job driver and a RolloutManager-like
  1-CPU actor), node IP ``127.0.0.2``, dashboard/Jobs API on ``http://127.0.0.1:<8265 or free>``;
* worker ``i`` (1-based): ``--num-gpus=G --num-cpus=C`` (C >= G), node IP ``127.0.0.<2+i>`` and a
  custom resource ``miles_ray_node_<i>: 1`` that identifies it.

Why one loopback address per node: ``127.0.0.1`` is rewritten by Ray to the machine's external
address, any other ``127.x.y.z`` is kept (every one of them is on ``lo``). Distinct addresses make
Miles's bundle sort -- by (node IP, GPU id) -- group bundles by node, as on a real cluster; with one
shared address the sort would interleave the nodes' bundles.

Workers are started ONE AT A TIME (parallel starts race on socket names in the shared temp dir).
Every process gets ``RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0
RAY_AUTH_MODE=disabled`` explicitly, a 200 MB object store and a short ``--temp-dir``.

The functions here take and return plain types (paths, ints, dicts) for the CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from miles_ray.adapters import state as state_store
from miles_ray.core.errors import ClusterError, ConfigError

Progress = Callable[[str], None] | None

HEAD_IP = "127.0.0.2"
HEAD_CPUS = 2
OBJECT_STORE_BYTES = 200_000_000
PREFERRED_DASHBOARD_PORT = 8265
NODE_RESOURCE_PREFIX = "miles_ray_node_"
HEAD_RESOURCE = "miles_ray_head"
STOP_GRACE_SECONDS = 8.0
LEADER_ONLY_SECONDS = 3.0  # then every member of the session gets SIGTERM too
LOCK_TIMEOUT_SECONDS = 300.0
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_AUTH_MODE": "disabled",
}


# --------------------------------------------------------------------------------------------
# small helpers: state file, processes, ports, HTTP
# --------------------------------------------------------------------------------------------


def _say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name or ""):
        raise ConfigError(
            f"invalid local cluster name {name!r}",
            hint="use 1-40 characters: lower-case letters, digits, '-' or '_'",
        )


def state_path(state_dir: Path, name: str) -> Path:
    return Path(state_dir) / f"{name}.json"


@contextlib.contextmanager
def _locked(state_dir: Path, name: str):
    """Serialise commands on one local cluster (the state file's lock, shared with miles_ray.adapters.state)."""
    with state_store.locked(state_path(state_dir, name), timeout=LOCK_TIMEOUT_SECONDS):
        yield


def _read_state(state_dir: Path, name: str) -> dict | None:
    return state_store.read_json(state_path(state_dir, name))


def _write_state(state_dir: Path, name: str, data: dict) -> None:
    state_store.atomic_write_json(state_path(state_dir, name), data)


def _remove_state(state_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(state_dir, name).unlink()


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, session id, start time in clock ticks) of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; session is field 6, starttime field 22
    return fields[0], int(fields[3]), int(fields[19])


def _start_ticks(pid: int) -> int | None:
    st = _proc_stat(pid)
    return st[2] if st else None


def _leader_alive(proc: dict) -> bool:
    st = _proc_stat(int(proc["pid"]))
    return bool(st) and st[0] not in ("Z", "X") and st[2] == int(proc["start_ticks"])


def session_members(proc: dict) -> list[int]:
    """Live (non-zombie) PIDs in the session this node's ``ray start`` leader created.

    Ray workers get their own process group but stay in the session, so the session -- not the
    process group -- is what holds everything a node started. Only processes started no earlier
    than the recorded leader count, which guards against PID reuse.
    """
    sid, since = int(proc["pid"]), int(proc["start_ticks"])
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _proc_stat(int(entry))
        if st and st[1] == sid and st[0] not in ("Z", "X") and st[2] >= since:
            pids.append(int(entry))
    return sorted(pids)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect an exited child of this process (when ``up`` ran here) so it does not linger."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_processes(procs: list[dict], grace: float = STOP_GRACE_SECONDS) -> dict:
    """Stop the given node sessions: SIGTERM, then SIGKILL whatever is left after ``grace``.

    SIGTERM goes to each ``ray start --block`` leader first (it shuts its own node down in ~2 s;
    signalling every member at once made the head's shutdown hang); members of a session whose
    leader is gone, or still there after a few seconds (a head with a running job ignores its
    leader's SIGTERM), get SIGTERM directly.
    """
    t0 = time.monotonic()
    all_pids = sorted({pid for p in procs for pid in session_members(p)})
    for p in procs:
        if _leader_alive(p):
            _signal_all([int(p["pid"])], signal.SIGTERM)
        else:
            _signal_all(session_members(p), signal.SIGTERM)
    deadline = t0 + grace
    escalated_at: float | None = None
    leaders = {int(p["pid"]) for p in procs}
    left: list[int] = all_pids
    while time.monotonic() < deadline:
        for p in procs:
            _reap(int(p["pid"]))
        left = sorted({pid for p in procs for pid in session_members(p)})
        if not left:
            break
        now = time.monotonic()
        if escalated_at is None and now > t0 + min(LEADER_ONLY_SECONDS, grace / 2):
            _signal_all(left, signal.SIGTERM)
            escalated_at = now
        elif escalated_at is not None and set(left) <= leaders and now > escalated_at + 1.0:
            # only `ray start --block` monitors are left: once their node is gone under them they
            # hang in their SIGTERM handler (measured); nothing of the node is left to shut down.
            break
        time.sleep(0.1)
    killed = sorted({pid for p in procs for pid in session_members(p)})
    if killed:
        _signal_all(killed, signal.SIGKILL)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(session_members(p) for p in procs):
            time.sleep(0.1)
    for p in procs:
        _reap(int(p["pid"]))
    return {"pids": len(all_pids), "force_killed": len(killed), "seconds": round(time.monotonic() - t0, 2)}


def _port_free(port: int) -> bool:
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if host == "127.0.0.1":
                s.settimeout(0.2)
                if s.connect_ex((host, port)) == 0:
                    return False
                continue
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def _free_port(taken: set[int]) -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise ClusterError("could not find a free TCP port")


def _node_ip(index: int) -> str:
    k = 2 + index  # head 127.0.0.2, worker i -> 127.0.0.(2+i), wrapping into the third octet
    return f"127.0.{k // 250}.{k % 250 + (2 if k // 250 else 0)}"


def fetch_nodes(dashboard_url: str, timeout: float = 5.0) -> list[dict]:
    """All nodes (ALIVE and DEAD) from the state API ``GET /api/v0/nodes``."""
    url = dashboard_url.rstrip("/") + "/api/v0/nodes?limit=10000"
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (local http)
        payload = json.load(resp)
    data = payload.get("data", {}).get("result", {})
    rows = data.get("result", data) if isinstance(data, dict) else data
    return list(rows or [])


def _alive(nodes: list[dict]) -> list[dict]:
    return [n for n in nodes if n.get("state") == "ALIVE"]


def _node_index(node: dict) -> int | None:
    for key in (node.get("resources_total") or {}):
        if key.startswith(NODE_RESOURCE_PREFIX):
            with contextlib.suppress(ValueError):
                return int(key[len(NODE_RESOURCE_PREFIX) :])
    return None


def _tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _ray_executable() -> str:
    cand = Path(sys.executable).parent / "ray"
    if cand.exists():
        return str(cand)
    found = shutil.which("ray")
    if not found:
        raise ClusterError("the `ray` command is not installed", hint='pip install "ray[default]"')
    return found


def _ray_version() -> str:
    try:
        from importlib.metadata import version

        return version("ray")
    except Exception:  # noqa: BLE001
        return "unknown"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    env.update(RAY_ENV)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


_CHILDREN: list[subprocess.Popen] = []  # keeps Popen objects (and their reaping) for this process


def _spawn(args: list[str], log_path: Path) -> dict:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603
            [_ray_executable(), "start", "--block", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN.append(proc)
    ticks = None
    for _ in range(50):
        ticks = _start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "start_ticks": ticks or 0, "log": str(log_path), "_popen": proc}


def _public(proc: dict) -> dict:
    return {k: v for k, v in proc.items() if not k.startswith("_")}


def _exited(proc: dict) -> bool:
    popen = proc.get("_popen")
    if popen is not None:
        return popen.poll() is not None
    return not _leader_alive(proc)


# --------------------------------------------------------------------------------------------
# node start / wait
# --------------------------------------------------------------------------------------------


def _wait_for(
    what: str,
    check: Callable[[list[dict]], Any],
    dashboard_url: str,
    watched: list[dict],
    timeout: float,
) -> Any:
    deadline = time.monotonic() + timeout
    last_err = ""
    while True:
        try:
            nodes = fetch_nodes(dashboard_url, timeout=3)
            got = check(nodes)
            if got:
                return got
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last_err = str(exc)
        for proc in watched:
            if _exited(proc):
                raise ClusterError(
                    f"local Ray {what} exited while starting (log {proc['log']}):\n{_tail(proc['log'])}"
                )
        if time.monotonic() > deadline:
            raise ClusterError(
                f"local Ray {what} was not ready within {timeout:.0f}s"
                + (f" (last error: {last_err})" if last_err else ""),
                hint=f"see {watched[-1]['log'] if watched else dashboard_url}",
            )
        time.sleep(0.3)


def _start_worker(state: dict, index: int, taken: set[int], timeout: float) -> dict:
    g, c = int(state["gpus_per_node"]), int(state["cpus_per_node"])
    ip = _node_ip(index)
    args = [
        f"--address={state['gcs_address']}",
        f"--node-ip-address={ip}",
        f"--num-gpus={g}",
        f"--num-cpus={c}",
        f"--object-store-memory={int(state['object_store_memory'])}",
        f"--temp-dir={state['temp_dir']}",
        f"--dashboard-agent-listen-port={_free_port(taken)}",
        "--include-log-monitor=False",  # the head's log monitor already reads the shared session dir
        "--min-worker-port=0",  # OS-chosen worker ports: raylets on one host must not share a port range
        "--max-worker-port=0",
        f"--resources={json.dumps({f'{NODE_RESOURCE_PREFIX}{index}': 1})}",
        "--disable-usage-stats",
    ]
    proc = _spawn(args, Path(state["temp_dir"]) / "logs" / f"worker-{index}.log")
    key = f"{NODE_RESOURCE_PREFIX}{index}"

    def ready(nodes: list[dict]) -> dict | None:
        for n in _alive(nodes):
            if key in (n.get("resources_total") or {}) and float(n["resources_total"].get("GPU", 0)) == g:
                return n
        return None

    try:
        node = _wait_for(f"worker node {index}", ready, state["dashboard_url"], [proc], timeout)
    except BaseException:
        stop_processes([proc], grace=3)
        raise
    out = _public(proc)
    out.update({"index": index, "ip": ip, "node_id": node.get("node_id"), "gpus": g, "cpus": c})
    return out


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def up(
    state_dir: Path,
    name: str,
    nodes: int,
    gpus_per_node: int = 8,
    cpus_per_node: int | None = None,
    progress: Progress = None,
    timeout: float = 120,
    head_cpus: int = HEAD_CPUS,
) -> dict:
    """Start head + ``nodes`` GPU worker raylets; return the cluster's status dict.

    An already-live cluster of that name is returned unchanged with ``already_running=True``.
    On any failure everything started here is stopped and the state removed.
    """
    _check_name(name)
    cpus = gpus_per_node if cpus_per_node is None else cpus_per_node
    if nodes < 0 or gpus_per_node < 0:
        raise ConfigError("nodes and GPUs per node must be >= 0")
    if cpus < gpus_per_node or cpus < 1:
        raise ConfigError(
            f"each local node needs at least as many CPUs as GPUs (got {cpus} CPUs, {gpus_per_node} GPUs)",
            hint="Miles asks for one CPU with every GPU bundle",
        )
    state_dir = Path(state_dir)
    with _locked(state_dir, name):
        old = _read_state(state_dir, name)
        if old is not None:
            if any(session_members(p) for p in _all_procs(old)):
                if not _head_answers(old, attempts=5):
                    raise ClusterError(
                        f"local cluster {name!r} has running processes but its head at "
                        f"{old['dashboard_url']} does not answer",
                        hint=f"stop it with `miles-ray down --backend local --name {name}`, then start again",
                    )
                out = _status_from_state(old)
                out["already_running"] = True
                out["requested_nodes"] = nodes
                out["matches_request"] = out["gpu_node_count"] == nodes and old.get("gpus_per_node") == gpus_per_node
                return out
            _say(progress, f"removing leftovers of a stopped local cluster {name!r}")
            _cleanup(state_dir, name, old)
        return _up_locked(state_dir, name, nodes, gpus_per_node, cpus, progress, timeout, head_cpus)


def _up_locked(
    state_dir: Path,
    name: str,
    nodes: int,
    gpus: int,
    cpus: int,
    progress: Progress,
    timeout: float,
    head_cpus: int = HEAD_CPUS,
) -> dict:
    t0 = time.monotonic()
    digest = hashlib.sha1(f"{state_dir.resolve()}/{name}/{time.time_ns()}".encode()).hexdigest()[:8]
    temp_dir = f"/tmp/mr-{digest}"
    Path(temp_dir).mkdir(parents=True, exist_ok=False)
    taken: set[int] = set()
    dash = PREFERRED_DASHBOARD_PORT if _port_free(PREFERRED_DASHBOARD_PORT) else _free_port(taken)
    taken.add(dash)
    gcs_port = _free_port(taken)
    state: dict[str, Any] = {
        "version": 1,
        "backend": "local",
        "name": name,
        "phase": "starting",
        "dashboard_url": f"http://127.0.0.1:{dash}",
        "gcs_address": f"{HEAD_IP}:{gcs_port}",
        "temp_dir": temp_dir,
        "gpus_per_node": gpus,
        "cpus_per_node": cpus,
        "head_cpus": head_cpus,
        "object_store_memory": OBJECT_STORE_BYTES,
        "ray_version": _ray_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_unix": time.time(),
        "head": None,
        "workers": [],
    }
    head_args = [
        "--head",
        f"--port={gcs_port}",
        f"--node-ip-address={HEAD_IP}",
        "--num-gpus=0",
        f"--num-cpus={head_cpus}",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=True",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={_free_port(taken)}",
        f"--dashboard-agent-listen-port={_free_port(taken)}",
        f"--resources={json.dumps({HEAD_RESOURCE: 1})}",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--disable-usage-stats",
    ]
    started: list[dict] = []
    try:
        _say(progress, f"starting head node (GCS {state['gcs_address']}, dashboard {state['dashboard_url']})")
        head = _spawn(head_args, Path(temp_dir) / "logs" / "head.log")
        started.append(head)
        state["head"] = _public(head)
        _write_state(state_dir, name, state)  # PIDs are on disk before anything else can go wrong

        def head_ready(ns: list[dict]) -> dict | None:
            return next((n for n in _alive(ns) if n.get("is_head_node")), None)

        node = _wait_for("head node", head_ready, state["dashboard_url"], [head], timeout)
        state["head"].update({"ip": HEAD_IP, "node_id": node.get("node_id"), "gpus": 0, "cpus": head_cpus})
        _write_state(state_dir, name, state)
        deadline = t0 + timeout
        for index in range(1, nodes + 1):
            _say(progress, f"starting worker node {index}/{nodes} ({gpus} GPUs, {cpus} CPUs, {_node_ip(index)})")
            remaining = max(10.0, deadline - time.monotonic())
            worker = _start_worker(state, index, taken, remaining)
            started.append(worker)
            state["workers"].append(worker)
            _write_state(state_dir, name, state)
        _wait_for(
            f"cluster ({nodes} GPU nodes)",
            lambda ns: _topology_ok(ns, nodes, gpus),
            state["dashboard_url"],
            [head],
            max(10.0, deadline - time.monotonic()),
        )
        state["phase"] = "running"
        state["up_seconds"] = round(time.monotonic() - t0, 2)
        _write_state(state_dir, name, state)
    except BaseException as exc:
        _say(progress, "start failed; stopping what was started")
        stop_processes([p for p in started if p.get("pid")], grace=5)
        shutil.rmtree(temp_dir, ignore_errors=True)
        _remove_state(state_dir, name)
        if isinstance(exc, ClusterError | KeyboardInterrupt):
            raise
        raise ClusterError(f"could not start local Ray cluster {name!r}: {exc}") from exc
    out = _status_from_state(state)
    out["already_running"] = False
    out["up_seconds"] = state["up_seconds"]
    return out


def _topology_ok(nodes: list[dict], n_workers: int, gpus: int) -> bool:
    alive = _alive(nodes)
    heads = [n for n in alive if n.get("is_head_node")]
    workers = [n for n in alive if not n.get("is_head_node")]
    gpu_ok = all(float((n.get("resources_total") or {}).get("GPU", 0)) == gpus for n in workers)
    head_gpus = sum(float((n.get("resources_total") or {}).get("GPU", 0)) for n in heads)
    return len(heads) == 1 and head_gpus == 0 and len(workers) == n_workers and gpu_ok


def _head_answers(state: dict, attempts: int = 1) -> bool:
    """The head's state API lists an ALIVE head node (retried: a busy 2-core box answers slowly)."""
    for attempt in range(attempts):
        try:
            if any(n.get("is_head_node") for n in _alive(fetch_nodes(state["dashboard_url"], timeout=5))):
                return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if attempt + 1 < attempts:
            time.sleep(1.0)
    return False


def _head_is_live(state: dict) -> bool:
    head = state.get("head")
    return bool(head) and _leader_alive(head) and _head_answers(state, attempts=3)


def _all_procs(state: dict) -> list[dict]:
    return [p for p in [*(state.get("workers") or []), state.get("head")] if p and p.get("pid")]


def _cleanup(state_dir: Path, name: str, state: dict, grace: float = STOP_GRACE_SECONDS) -> dict:
    result = stop_processes(_all_procs(state), grace=grace)
    temp_dir = state.get("temp_dir") or ""
    if temp_dir.startswith("/tmp/mr-"):
        shutil.rmtree(temp_dir, ignore_errors=True)
    _remove_state(state_dir, name)
    return result


def _describe(node: dict) -> dict:
    res = node.get("resources_total") or {}
    return {
        "node_id": node.get("node_id"),
        "ip": node.get("node_ip"),
        "node_ip": node.get("node_ip"),
        "is_head": bool(node.get("is_head_node")),
        "state": node.get("state"),
        "index": 0 if node.get("is_head_node") else _node_index(node),
        "gpus": float(res.get("GPU", 0)),
        "cpus": float(res.get("CPU", 0)),
    }


def _status_from_state(state: dict, nodes: list[dict] | None = None) -> dict:
    if nodes is None:
        try:
            nodes = fetch_nodes(state["dashboard_url"], timeout=5)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ClusterError(
                f"the head of local cluster {state['name']!r} at {state['dashboard_url']} is unreachable ({exc})",
                hint=f"run `miles-ray down --backend local --name {state['name']}` and `miles-ray up` again",
            ) from exc
    described = [_describe(n) for n in nodes]
    alive = [n for n in described if n["state"] == "ALIVE"]
    dead = [n for n in described if n["state"] != "ALIVE"]
    workers = state.get("workers") or []
    pid_alive = {w["index"]: _leader_alive(w) for w in workers}
    for n in alive:
        if n["index"] in pid_alive:
            n["process_alive"] = pid_alive[n["index"]]
    gpu_nodes = [n for n in alive if n["gpus"] > 0]
    return {
        "name": state["name"],
        "backend": "local",
        "dashboard_url": state["dashboard_url"],
        "address": state["dashboard_url"],
        "gcs_address": state["gcs_address"],
        "temp_dir": state["temp_dir"],
        "ray_version": state.get("ray_version"),
        "created": state.get("created"),
        "gpus_per_node": state.get("gpus_per_node"),
        "cpus_per_node": state.get("cpus_per_node"),
        "nodes": sorted(alive, key=lambda n: (not n["is_head"], n["index"] or 0)),
        "dead_nodes": dead,
        "alive_count": len(alive),
        "dead_count": len(dead),
        "gpu_node_count": len(gpu_nodes),
        "total_gpus": sum(n["gpus"] for n in alive),
        "total_cpus": sum(n["cpus"] for n in alive),
        "head_pid": (state.get("head") or {}).get("pid"),
        "worker_pids": {str(w["index"]): w["pid"] for w in workers},
    }


def status(state_dir: Path, name: str) -> dict:
    """Alive/dead nodes, per-node GPUs/CPUs, totals, dashboard URL of a local cluster."""
    _check_name(name)
    state = _read_state(Path(state_dir), name)
    if state is None:
        raise ClusterError(
            f"no local cluster named {name} is running", hint="start one with `miles-ray up --backend local`"
        )
    return _status_from_state(state)


def scale(
    state_dir: Path,
    name: str,
    nodes: int,
    progress: Progress = None,
    timeout: float = 120,
) -> dict:
    """Grow (new workers, one at a time) or shrink (stop the highest-index workers by PID) to ``nodes``."""
    _check_name(name)
    if nodes < 0:
        raise ConfigError("nodes must be >= 0")
    state_dir = Path(state_dir)
    with _locked(state_dir, name):
        state = _read_state(state_dir, name)
        if state is None or not any(session_members(p) for p in _all_procs(state)):
            raise ClusterError(
                f"no local cluster named {name} is running", hint="start one with `miles-ray up --backend local`"
            )
        if not _head_is_live(state):
            raise ClusterError(
                f"the head of local cluster {name!r} at {state['dashboard_url']} does not answer",
                hint=f"`miles-ray down --backend local --name {name}` and start again",
            )
        t0 = time.monotonic()
        workers: list[dict] = sorted(state["workers"], key=lambda w: w["index"])
        added, removed = [], []
        taken: set[int] = set()
        while len(workers) < nodes:
            index = (workers[-1]["index"] if workers else 0) + 1
            _say(progress, f"adding worker node {index} ({_node_ip(index)})")
            worker = _start_worker(state, index, taken, max(10.0, timeout - (time.monotonic() - t0)))
            workers.append(worker)
            state["workers"] = workers
            _write_state(state_dir, name, state)
            added.append(index)
        while len(workers) > nodes:
            victim = workers.pop()
            _say(progress, f"removing worker node {victim['index']} (pid {victim['pid']})")
            stop_processes([victim])
            state["workers"] = workers
            _write_state(state_dir, name, state)
            node_id = victim.get("node_id")
            _wait_for(
                f"removal of worker node {victim['index']}",
                lambda ns, nid=node_id: all(n.get("node_id") != nid for n in _alive(ns)),
                state["dashboard_url"],
                [],
                max(10.0, timeout - (time.monotonic() - t0)),
            )
            removed.append(victim["index"])
        out = _status_from_state(state)
        out.update({"added": added, "removed": removed, "scale_seconds": round(time.monotonic() - t0, 2)})
        return out


def down(state_dir: Path, name: str, grace: float = STOP_GRACE_SECONDS) -> dict:
    """Stop exactly the processes ``up``/``scale`` started (by session/PID); remove state and temp dir."""
    _check_name(name)
    state_dir = Path(state_dir)
    with _locked(state_dir, name):
        state = _read_state(state_dir, name)
        if state is None:
            raise ClusterError(f"no local cluster named {name} is running")
        live = [p for p in _all_procs(state) if session_members(p)]
        result = _cleanup(state_dir, name, state, grace=grace)
        if not live:
            raise ClusterError(
                f"no local cluster named {name} is running", hint="removed the state of a cluster that had stopped"
            )
        result.update({"name": name, "stopped_nodes": len(live), "temp_dir": state.get("temp_dir")})
        return result


def cluster_pids(state_dir: Path, name: str) -> list[int]:
    """Every live PID of the cluster (for memory accounting and tests)."""
    state = _read_state(Path(state_dir), name)
    if state is None:
        return []
    return sorted({pid for p in _all_procs(state) for pid in session_members(p)})


def pss_bytes(pids: list[int]) -> int:
    """Sum of proportional set sizes (``/proc/<pid>/smaps_rollup``) of the given processes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total
