"""The local test backend's fault injection: extra Ray worker nodes that join a running local cluster with a
REAL difference from the other nodes -- never a switch of the product.

* a per-node mount difference: the node's raylet (and so every Ray worker it forks) runs in its own mount
  namespace (``unshare --mount``, root), where a directory is bind-mounted over another one -- e.g. the shared
  volume's parent, so that on this node the volume is an empty local directory, or absent;
* a fault in the comm-check ring: the node runs with ``tests/infra/comm_fault`` on PYTHONPATH (its
  ``sitecustomize.py``) and ``MILESRAY_TEST_COMM_FAULT`` set, so the comm check's listener on that node never
  listens (peers are refused) or its actor never finishes starting.

Each node is its own ``ray start --block`` in a new session (advertising ``gpus`` fake GPUs, like the cluster's
workers, on its own loopback IP, with a custom resource naming it); :meth:`ExtraNode.stop` stops exactly that
session's processes by PID and waits until Ray no longer lists the node as ALIVE.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

COMM_FAULT_DIR = Path(__file__).resolve().parent / "comm_fault"
COMM_FAULT_ENV = "MILESRAY_TEST_COMM_FAULT"
RESOURCE_PREFIX = "miles_ray_test_node_"
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0", "RAY_AUTH_MODE": "disabled"}


@dataclass
class NodeSpec:
    """One extra node: its loopback IP, a tag naming it, bind mounts (source -> target) in its own mount
    namespace, extra environment for its processes."""

    ip: str
    tag: str
    mounts: list[tuple[Path, Path]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class ExtraNode:
    spec: NodeSpec
    pid: int
    log: Path
    dashboard_url: str
    node_id: str | None = None

    @property
    def ip(self) -> str:
        return self.spec.ip

    def session_pids(self) -> list[int]:
        """Every live process of this node's session (the raylet, its agents and its Ray workers)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == self.pid and fields[0] not in ("Z", "X"):
                pids.append(int(entry))
        return sorted(pids)

    def stop(self, timeout: float = 90) -> None:
        """SIGTERM to the node's session (``ray start`` stops its raylet), SIGKILL after a grace period; then wait
        until Ray no longer lists the node ALIVE."""
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid in self.session_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while self.session_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.session_pids():
                break
        left = self.session_pids()
        assert not left, f"extra node {self.spec.tag}: processes left after SIGKILL: {left}"
        deadline = time.monotonic() + timeout
        while self.node_id and any(n["node_id"] == self.node_id for n in alive_nodes(self.dashboard_url)):
            assert time.monotonic() < deadline, f"Ray still lists extra node {self.spec.tag} ALIVE after {timeout}s"
            time.sleep(1)


def alive_nodes(dashboard_url: str) -> list[dict]:
    from miles_ray.adapters import ray_auth

    request = urllib.request.Request(f"{dashboard_url}/api/v0/nodes?limit=10000", headers=ray_auth.headers(dashboard_url))
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        data = json.load(resp)["data"]["result"]
    rows = data.get("result", []) if isinstance(data, dict) else data
    return [n for n in rows if n.get("state") == "ALIVE"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(cluster: dict, spec: NodeSpec, timeout: float = 180) -> ExtraNode:
    """Start ``spec`` as a worker of the local cluster whose status is ``cluster`` (``local_ray.status``: its
    ``gcs_address``, ``temp_dir``, ``dashboard_url``, ``gpus_per_node``, ``cpus_per_node``)."""
    ray = Path(sys.executable).parent / "ray"
    resource = f"{RESOURCE_PREFIX}{spec.tag}"
    args = [str(ray), "start", "--block", f"--address={cluster['gcs_address']}", f"--node-ip-address={spec.ip}",
            f"--num-gpus={cluster['gpus_per_node']}", f"--num-cpus={cluster['cpus_per_node']}",
            "--object-store-memory=100000000", f"--temp-dir={cluster['temp_dir']}",
            f"--dashboard-agent-listen-port={_free_port()}", "--include-log-monitor=False",
            "--min-worker-port=0", "--max-worker-port=0", f"--resources={json.dumps({resource: 1})}",
            "--disable-usage-stats"]
    if spec.mounts:
        binds = " && ".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}" for src, dst in spec.mounts)
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", f"{binds} && exec {shlex.join(args)}"]
    else:
        argv = args
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env.update(RAY_ENV)
    if cluster.get("auth") == "token":  # join with the cluster's token (the session exports its token file)
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": os.environ["RAY_AUTH_TOKEN_PATH"]})
    env["PATH"] = f"{ray.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(spec.env)
    log = Path(cluster["temp_dir"]) / "logs" / f"test-extra-node-{spec.tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,  # noqa: S603
                                start_new_session=True, close_fds=True)
    node = ExtraNode(spec=spec, pid=proc.pid, log=log, dashboard_url=cluster["dashboard_url"])
    deadline = time.monotonic() + timeout
    while True:
        found = [n for n in alive_nodes(node.dashboard_url) if resource in (n.get("resources_total") or {})]
        if found:
            node.node_id = found[0]["node_id"]
            return node
        if proc.poll() is not None or time.monotonic() > deadline:
            node.stop()
            raise AssertionError(f"extra node {spec.tag} did not join within {timeout:.0f}s "
                                 f"(exit {proc.poll()}):\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)


@contextmanager
def extra_nodes(cluster: dict, specs: list[NodeSpec]) -> Iterator[list[ExtraNode]]:
    """Start ``specs`` (one at a time: parallel starts race on socket names in the shared temp dir); stop every one
    of them at the end, whatever happened."""
    started: list[ExtraNode] = []
    try:
        for spec in specs:
            started.append(start_node(cluster, spec))
        yield started
    finally:
        for node in reversed(started):
            node.stop()


def comm_fault_env(kind: str) -> dict[str, str]:
    """The environment of a node whose comm-check ring is broken: ``closed-port`` (its listener never listens, so
    the peer that must connect to it is refused) or ``no-start`` (its actor never finishes starting)."""
    assert kind in ("closed-port", "no-start"), kind
    return {"PYTHONPATH": str(COMM_FAULT_DIR), COMM_FAULT_ENV: kind}
