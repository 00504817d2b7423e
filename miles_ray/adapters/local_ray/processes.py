"""Processes of a local cluster: found through ``/proc``, started and stopped by session and PID only.

Every node is one ``ray start --block`` process started in a new session (``setsid``): that node's
raylet, agents and every Ray worker it forks stay in the session, so the session id names exactly
what the node started. Never ``ray stop``, never by process name.

Ray Jobs is the exception: the job supervisor starts each job's entrypoint in a session of its own,
so a job driver survives its node's session. :func:`job_sessions` finds those sessions (a process
whose environment carries this cluster's GCS address and a Ray Jobs config), so that stopping a
cluster -- or a head that was killed -- leaves no driver running.

A *session record* is a dict ``{"pid": <session leader>, "start_ticks": <its start time>}`` (plus
whatever the caller keeps beside it); the start time guards every lookup against PID reuse.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from miles_ray.core.errors import ClusterError

STOP_GRACE_SECONDS = 8.0
LEADER_ONLY_SECONDS = 3.0  # then every member of the session gets SIGTERM too
KILL_WAIT_SECONDS = 10.0  # after SIGKILL: until the kernel has taken every process away
JOB_ENV_MARKER = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray Jobs on every job entrypoint

_CHILDREN: list[subprocess.Popen] = []  # Popen objects of the nodes this process started (for reaping)


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state letter, parent PID, session id, start time in clock ticks) of a process, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; ppid field 4, session field 6, starttime field 22
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    st = proc_stat(pid)
    return st[3] if st else None


def _live(st: tuple[str, int, int, int] | None) -> bool:
    return bool(st) and st[0] not in ("Z", "X")


def leader_alive(record: dict) -> bool:
    """The session leader (the ``ray start --block`` process of a node) is still the process we started."""
    st = proc_stat(int(record["pid"]))
    return _live(st) and st[3] == int(record["start_ticks"])


def session_members(record: dict) -> list[int]:
    """Live (non-zombie) PIDs in the session this record's leader created.

    Ray workers get their own process group but stay in the session, so the session -- not the
    process group -- is what holds everything a node started. Only processes started no earlier
    than the recorded leader count, which guards against PID reuse.
    """
    sid, since = int(record["pid"]), int(record["start_ticks"])
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_stat(int(entry))
        if _live(st) and st[2] == sid and st[3] >= since:
            pids.append(int(entry))
    return sorted(pids)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _is_job_of(pid: int, gcs_address: str) -> bool:
    env = _environ(pid)
    return env.get("RAY_ADDRESS") == gcs_address and JOB_ENV_MARKER in env


def job_sessions(gcs_address: str, since_ticks: int, exclude: set[int] = frozenset()) -> list[dict]:
    """Session records of the Ray Jobs entrypoints of the cluster whose GCS is ``gcs_address``.

    A session counts when one of its processes was started by Ray Jobs for this GCS (its
    environment says so) no earlier than ``since_ticks`` (the head's start), and its leader is that
    kind of process too or already gone -- never a session someone else leads (a user's shell).
    """
    own = {os.getpid(), os.getppid()}
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = proc_stat(pid)
        if not _live(st) or st[3] < since_ticks or st[2] in exclude or pid in own or st[2] in own:
            continue
        if not _is_job_of(pid, gcs_address):
            continue
        sid = st[2]
        leader = proc_stat(sid)
        if _live(leader) and leader[3] >= since_ticks and (sid == pid or _is_job_of(sid, gcs_address)):
            found[sid] = leader[3]
        elif not _live(leader):
            found[sid] = min(found.get(sid, st[3]), st[3])
    return [{"pid": sid, "start_ticks": ticks} for sid, ticks in sorted(found.items())]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect an exited child of this process (when ``up`` ran here) so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _members(records: list[dict]) -> list[int]:
    return sorted({pid for r in records for pid in session_members(r)})


def stop_sessions(nodes: list[dict], jobs: list[dict] = (), grace: float = STOP_GRACE_SECONDS) -> dict:
    """Stop node sessions (and job-driver sessions): SIGTERM, then SIGKILL whatever is left after ``grace``.

    SIGTERM goes to each node's ``ray start --block`` leader first (it shuts its own node down in
    ~2 s; signalling every member at once made the head's shutdown hang); members of a session
    whose leader is gone, or still there after a few seconds (a head with a running job ignores its
    leader's SIGTERM), get SIGTERM directly. Job drivers get SIGTERM at once. Returns counts, and in
    ``left`` any PID still there after SIGKILL (a process stuck in the kernel).
    """
    t0 = time.monotonic()
    records = [*nodes, *jobs]
    all_pids = _members(records)
    for r in nodes:
        if leader_alive(r):
            signal_all([int(r["pid"])], signal.SIGTERM)
        else:
            signal_all(session_members(r), signal.SIGTERM)
    signal_all(_members(list(jobs)), signal.SIGTERM)
    deadline = t0 + grace
    escalated_at: float | None = None
    leaders = {int(r["pid"]) for r in nodes}
    while time.monotonic() < deadline:
        for r in nodes:
            _reap(int(r["pid"]))
        left = _members(records)
        if not left:
            break
        now = time.monotonic()
        if escalated_at is None and now > t0 + min(LEADER_ONLY_SECONDS, grace / 2):
            signal_all(left, signal.SIGTERM)
            escalated_at = now
        elif escalated_at is not None and set(left) <= leaders and now > escalated_at + 1.0:
            # only `ray start --block` monitors are left: once their node is gone under them they
            # hang in their SIGTERM handler (measured); nothing of the node is left to shut down.
            break
        time.sleep(0.1)
    killed = _members(records)
    if killed:
        signal_all(killed, signal.SIGKILL)
        end = time.monotonic() + KILL_WAIT_SECONDS
        while time.monotonic() < end and _members(records):
            for r in nodes:
                _reap(int(r["pid"]))
            time.sleep(0.1)
    for r in nodes:
        _reap(int(r["pid"]))
    return {
        "pids": len(all_pids),
        "force_killed": len(killed),
        "left": _members(records),
        "seconds": round(time.monotonic() - t0, 2),
    }


def exited(record: dict) -> bool:
    """The node's ``ray start --block`` process has ended (it gives up by itself when its node fails)."""
    popen = record.get("_popen")
    if popen is not None:
        return popen.poll() is not None
    return not leader_alive(record)


def public(record: dict) -> dict:
    """The record without this process's private handles (what goes into the state file)."""
    return {k: v for k, v in record.items() if not k.startswith("_")}


def ray_executable() -> str:
    cand = Path(sys.executable).parent / "ray"
    if cand.exists():
        return str(cand)
    found = shutil.which("ray")
    if not found:
        raise ClusterError("the `ray` command is not installed", hint='pip install "ray[default]"')
    return found


def spawn_ray_start(args: list[str], log_path: Path, env: dict[str, str]) -> dict:
    """Start ``ray start --block ARGS`` in a new session, output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603
            [ray_executable(), "start", "--block", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN.append(proc)
    ticks = None
    for _ in range(200):
        ticks = start_ticks(proc.pid)
        if ticks is not None:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "start_ticks": ticks or 0, "log": str(log_path), "_popen": proc}


def tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


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
