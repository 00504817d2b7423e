"""Real nodes (part of cluster/realnodes.py) on this machine: cgroups, namespaces, sysctls and a snapshot of them,
and the nodes' processes (spawned into their cgroup, waited on by their log, killed by PID)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from realnodes_plan import HOST_SYSCTLS, RealNodesError, tail


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (cpu, memory, ..., name=systemd)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[:1] == ["cgroup"]:
            out.append(Path(pre.split()[4]))
    return out


def own_memory_cgroup() -> str:
    """The caller's memory cgroup path ("/" if none): real-pod cgroups nest under it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return path
    return "/"


def make_cgroup(path: str, created: list[str]) -> None:
    """mkdir ``path`` (and missing parents) in every hierarchy; cpuset dirs get their parent's
    cpus/mems. Appends each directory it created to ``created``."""
    for mount in cgroup_hierarchies():
        parts = [p for p in path.split("/") if p]
        cur = mount
        for part in parts:
            parent, cur = cur, cur / part
            if cur.is_dir():
                continue
            cur.mkdir()
            created.append(str(cur))
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (cur / f).exists():
                    (cur / f).write_text((parent / f).read_text().strip() or "\n")


def cgroup_pids(path: str) -> set[int]:
    """Every PID in cgroup ``path`` or below, in any hierarchy."""
    pids: set[int] = set()
    for mount in cgroup_hierarchies():
        top = mount / path.lstrip("/")
        if not top.is_dir():
            continue
        for dirpath, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split())
                except OSError:
                    pass
    return pids


def remove_cgroup_tree(path: str) -> list[str]:
    """rmdir ``path`` and everything below it, deepest first, in every hierarchy; what is left."""
    left = []
    for mount in cgroup_hierarchies():
        top = mount / path.lstrip("/")
        if not top.is_dir():
            continue
        dirs = [Path(dp) for dp, _, _ in os.walk(top)]
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        if top.exists():
            left.append(str(top))
    return left


def ns_inode(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def pids_in_namespace(ns: str, kind: str) -> set[int]:
    """PIDs whose ``kind`` namespace (net, mnt) is ``ns`` (e.g. ``net:[4026532001]``)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_inode(int(entry), kind) == ns:
            out.add(int(entry))
    return out


def read_sysctls(names: tuple[str, ...] = HOST_SYSCTLS) -> dict[str, str]:
    """Values of the machine's sysctls (as the calling process sees them), missing ones left out."""
    out = {}
    for n in names:
        try:
            out[n.replace("/", ".")] = Path("/proc/sys", n).read_text().strip()
        except OSError:
            pass
    return out


def host_snapshot() -> dict[str, Any]:
    """What a real-pod cluster must leave as it found it on the machine: sysctls, network
    interfaces, named network namespaces, iptables rules, mount points."""

    def run(*argv: str) -> str:
        if not shutil.which(argv[0]):
            return f"({argv[0]} not installed)"
        r = subprocess.run(list(argv), text=True, capture_output=True)
        return r.stdout

    def rules(text: str) -> list[str]:  # iptables-save without comments and counters
        return [ln.split(" [")[0] if ln.startswith(":") else ln for ln in text.splitlines() if not ln.startswith("#")]

    mounts = sorted({ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()})
    return {
        "sysctls": read_sysctls(),
        "links": sorted(ln.split(":")[1].strip().split("@")[0] for ln in run("ip", "-o", "link", "show").splitlines()),
        "netns": sorted(run("ip", "netns", "list").split()),
        "iptables": rules(run("iptables-save")),
        "ip6tables": rules(run("ip6tables-save")),
        "mounts": mounts,
    }


# --------------------------------------------------------------------------------------------
# Processes


def spawn(fg: ModuleType, name: str, argv: list[str], logs: Path, die_with_parent: bool,
           cgroup: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start ``argv`` in its own session (like fakegpu's processes), optionally inside ``cgroup`` (all
    hierarchies, joined before exec so that everything it starts lands there too)."""
    procs_files = ([str(m / cgroup.lstrip("/") / "cgroup.procs") for m in cgroup_hierarchies()]
                   if cgroup else [])

    def pre() -> None:
        for f in procs_files:
            with open(f, "w") as fh:
                fh.write(str(os.getpid()))
        if die_with_parent:
            fg._pdeathsig()

    logf = open(logs / f"{name}.log", "ab", buffering=0)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True, close_fds=True, preexec_fn=pre)
    logf.close()
    st = None
    for _ in range(100):
        st = fg._proc_starttime(proc.pid)
        if st:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "pgid": proc.pid, "starttime": st, "argv": argv, "log": str(logs / f"{name}.log")}


def wait_log(rec: dict[str, Any], fg: ModuleType, text: str, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    path = Path(rec["log"])
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if not fg._is_ours_and_alive(rec):
            raise RealNodesError(f"{what} exited:\n{tail(path)}")
        time.sleep(0.1)
    raise RealNodesError(f"timed out after {timeout:.0f}s waiting for {what}:\n{tail(path)}")


def kill_pids(pids: set[int]) -> None:
    for pid in pids - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
