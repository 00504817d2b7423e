"""Real nodes (part of cluster/realnodes.py) stopped and the proof of it: containers, kubelets and containerd,
the DNS stub, the relay and the namespace, then whatever is left (process, mount, cgroup, namespace) and the
memory the cluster used."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from realnodes_build import ctr
from realnodes_host import (cgroup_hierarchies, cgroup_pids, host_snapshot, kill_pids, pids_in_namespace,
                            remove_cgroup_tree)
from realnodes_plan import MACHINE_IP, NSRELAY_PY, RealNodesError, tail


def _stop_node(fg: ModuleType, d: Path, real: dict[str, Any], n: dict[str, Any],
               log: Callable[[str], None]) -> dict[str, str]:
    """One node: kubelet, then its pods (SIGKILL by PID from the pods' cgroups, then killed and
    deleted through containerd), containerd, strays of its cgroups or mount namespace, the holder."""
    procs = real.get("processes", {})
    result: dict[str, str] = {}
    name = n["name"]
    t0 = time.monotonic()
    sock = d / "nodes" / name / "containerd" / "containerd.sock"
    cg = f"{real['cgroup_root']}/{name}"
    kubelet = procs.get(f"{name}-kubelet")
    if kubelet:
        result[f"{name}-kubelet"] = fg._stop(f"{name}-kubelet", kubelet, 10, log)
    kill_pids(cgroup_pids(f"{cg}/kubepods"))  # every container process at once
    cd = procs.get(f"{name}-containerd")
    if cd and fg._is_ours_and_alive(cd) and sock.exists():
        # Every container and sandbox of the node: killed and deleted through containerd.
        r = ctr(sock, "tasks", "ls", "-q", timeout=20)
        tasks = r.stdout.split() if r.returncode == 0 else []
        for t in tasks:
            ctr(sock, "tasks", "kill", "--signal", "SIGKILL", t, timeout=20)
        for t in tasks:
            for _ in range(50):
                if ctr(sock, "tasks", "delete", t, timeout=20).returncode == 0:
                    break
                time.sleep(0.1)
        r = ctr(sock, "containers", "ls", "-q", timeout=20)
        for c in (r.stdout.split() if r.returncode == 0 else []):
            ctr(sock, "containers", "delete", c, timeout=20)
        result[f"{name}-containers"] = f"{len(tasks)} task(s) killed and deleted"
    if cd:
        result[f"{name}-containerd"] = fg._stop(f"{name}-containerd", cd, 15, log)
    # Anything still in the node's cgroups (a shim, a container process) or mount namespace.
    holder = procs.get(f"{name}-ns")
    mnt = holder.get("mnt") if holder else None
    for _ in range(3):
        stray = cgroup_pids(cg) | (pids_in_namespace(mnt, "mnt") if mnt else set())
        if holder and fg._is_ours_and_alive(holder):
            stray.discard(holder["pid"])
        if not stray:
            break
        log(f"{name}: killing {len(stray)} leftover process(es) by PID: {sorted(stray)}")
        kill_pids(stray)
        time.sleep(0.3)
    if holder:
        result[f"{name}-ns"] = fg._stop(f"{name}-ns", holder, 5, log)
    real.setdefault("teardown_timings", {})[name] = round(time.monotonic() - t0, 1)
    return result


def relay_out(real: dict[str, Any], port: int, logs: Path) -> tuple[str, dict[str, Any]]:
    """Make the machine's 127.0.0.1:``port`` reachable from pods at ``MACHINE_IP:port`` (a relay listening in
    the cluster's namespace, connecting on the machine's loopback; nothing else of the machine is reachable).
    Returns (``http://MACHINE_IP:port``-style host without scheme, the relay's process record); stop it with
    :func:`stop_relay_out` before the cluster stops."""
    netns = f"/proc/{real['processes']['netns']['pid']}/ns/net"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"nsrelay-out-{port}.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen([sys.executable, str(NSRELAY_PY), "--netns", netns, "--outward",
                                 f"{MACHINE_IP}:{port}={port}"], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if "ready" in log_path.read_text(errors="replace"):
            return f"{MACHINE_IP}:{port}", {"pid": proc.pid, "log": str(log_path), "_proc": proc}
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RealNodesError(f"the relay to the machine's port {port} did not start:\n{tail(log_path)}")


def stop_relay_out(rec: dict[str, Any]) -> None:
    proc: subprocess.Popen = rec["_proc"]
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_nodes(fg: ModuleType, d: Path, real: dict[str, Any], log: Callable[[str], None]) -> dict[str, str]:
    """Containers, kubelets, containerds, node namespaces (all nodes at once), then the cgroups."""
    from concurrent.futures import ThreadPoolExecutor

    result: dict[str, str] = {}
    nodes = real.get("nodes", [])
    if nodes:
        with ThreadPoolExecutor(len(nodes)) as pool:
            for r in pool.map(lambda n: _stop_node(fg, d, real, n, log), nodes):
                result.update(r)
    left = remove_cgroup_tree(real["cgroup_root"]) if real.get("cgroup_root") else []
    for c in sorted(real.get("created_cgroups", []), key=lambda p: len(Path(p).parts), reverse=True):
        try:
            Path(c).rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(c)  # e.g. a shared parent another run still uses
    result["cgroups"] = "removed" if not left else f"left: {left}"
    return result


def stop_netns(fg: ModuleType, d: Path, real: dict[str, Any], log: Callable[[str], None]) -> dict[str, str]:
    """The DNS stub, the relay and the namespace holder (after the control plane stopped); then
    any process still in the namespace, by PID; then the nodes' containerd roots."""
    procs = real.get("processes", {})
    result = {}
    for name in ("dnsstub", "nsrelay"):
        if name in procs:
            result[name] = fg._stop(name, procs[name], 5, log)
    ns = real.get("netns")
    if ns:
        stray = pids_in_namespace(ns, "net")
        holder = procs.get("netns")
        if holder:
            stray.discard(holder["pid"])
        if stray:
            log(f"killing {len(stray)} leftover process(es) in the cluster namespace by PID: {sorted(stray)}")
            kill_pids(stray)
    if "netns" in procs:
        result["netns"] = fg._stop("netns", procs["netns"], 5, log)
    # The unpacked images (hard links into the template, plus the containers' layers): only once
    # nothing is mounted below the run directory any more.
    if not [m for m in host_snapshot()["mounts"] if m.startswith(str(d) + "/")]:
        for n in real.get("nodes", []):
            shutil.rmtree(d / "nodes" / n["name"] / "containerd", ignore_errors=True)
    return result


def leftovers(d: Path, real: dict[str, Any], fg: ModuleType) -> dict[str, list[Any]]:
    """Everything of a stopped real-pod cluster still on the machine (all lists empty = clean)."""
    procs = real.get("processes", {})
    out: dict[str, list[Any]] = {
        "processes": sorted(k for k, r in procs.items() if fg._is_ours_and_alive(r)),
        "netns_pids": sorted(pids_in_namespace(real["netns"], "net")) if real.get("netns") else [],
        "mntns_pids": sorted(p for r in procs.values() if r.get("mnt") for p in pids_in_namespace(r["mnt"], "mnt")),
        "cgroups": [str(m / real["cgroup_root"].lstrip("/")) for m in cgroup_hierarchies()
                    if real.get("cgroup_root") and (m / real["cgroup_root"].lstrip("/")).exists()]
        + [c for c in real.get("created_cgroups", []) if Path(c).exists()],
        "cgroup_pids": sorted(cgroup_pids(real["cgroup_root"])) if real.get("cgroup_root") else [],
        "mounts": [m for m in host_snapshot()["mounts"] if m.startswith(str(d) + "/")],
    }
    return out


def memory(real: dict[str, Any], control_plane: dict[str, Any], fg: ModuleType) -> dict[str, Any]:
    """RSS and PSS (MiB) of every process of the cluster: control plane, relay, DNS stub, node
    runtimes and pods (everything in the real nodes' cgroups)."""
    pids: dict[int, str] = {}
    for name, r in list(control_plane.items()) + list(real.get("processes", {}).items()):
        if fg._is_ours_and_alive(r):
            pids[r["pid"]] = name
    for n in real.get("nodes", []):
        cg = f"{real['cgroup_root']}/{n['name']}"
        for p in cgroup_pids(f"{cg}/runtime"):
            pids.setdefault(p, f"{n['name']}-runtime")
        for p in cgroup_pids(f"{cg}/kubepods"):
            pids.setdefault(p, f"{n['name']}-pods")
    groups: dict[str, dict[str, float]] = {}
    total = {"rss": 0.0, "pss": 0.0}
    for pid, group in pids.items():
        try:
            roll = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        vals = {ln.split(":")[0]: int(ln.split()[1]) / 1024 for ln in roll[1:] if ln.split()[0] in ("Rss:", "Pss:")}
        g = groups.setdefault(group, {"rss": 0.0, "pss": 0.0, "processes": 0})
        g["rss"] += vals.get("Rss", 0)
        g["pss"] += vals.get("Pss", 0)
        g["processes"] += 1
        total["rss"] += vals.get("Rss", 0)
        total["pss"] += vals.get("Pss", 0)
    return {"total_mib": {k: round(v) for k, v in total.items()},
            "by_group_mib": {k: {kk: round(vv) for kk, vv in v.items()} for k, v in sorted(groups.items())}}
