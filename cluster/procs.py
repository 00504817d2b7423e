"""The test clusters' processes: started detached with their log, recognised by PID and start time (never by
name), stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); starttime is field 22.
    return fields[19]


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_ours_and_alive(rec: dict[str, Any]) -> bool:
    pid = rec["pid"]
    try:  # reap if it is our child (pytest fixture case)
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    if proc_starttime(pid) != rec.get("starttime"):
        return False  # gone, or the PID was reused by another process
    return proc_state(pid) not in (None, "Z", "X")


def pdeathsig() -> None:
    """In the child, before exec: get SIGTERM when the parent (e.g. a pytest process) dies."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def start(
    name: str, argv: list[str], logs: Path, env: dict[str, str] | None = None, die_with_parent: bool = False
) -> dict[str, Any]:
    logf = open(logs / f"{name}.log", "ab", buffering=0)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,  # own process group: a Ctrl-C in the caller does not reach it
        close_fds=True,
        preexec_fn=pdeathsig if die_with_parent and sys.platform.startswith("linux") else None,
    )
    logf.close()
    st = None
    for _ in range(50):
        st = proc_starttime(proc.pid)
        if st:
            break
        time.sleep(0.01)
    return {
        "pid": proc.pid,
        "pgid": proc.pid,
        "starttime": st,
        "argv": argv,
        "log": str(logs / f"{name}.log"),
    }


def stop(name: str, rec: dict[str, Any], timeout: float, log: Callable[[str], None]) -> str:
    if not is_ours_and_alive(rec):
        return "not running"
    pid = rec["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_ours_and_alive(rec):
            return "stopped"
        time.sleep(0.05)
    log(f"{name} (pid {pid}) did not exit after SIGTERM within {timeout:.0f}s: SIGKILL")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    for _ in range(100):
        if not is_ours_and_alive(rec):
            break
        time.sleep(0.05)
    return "killed"


def tail(path: str | Path, n: int = 40) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])
