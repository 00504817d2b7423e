#!/usr/bin/env python3
"""A real Kubernetes control plane with fake GPU nodes, on 127.0.0.1, without Docker.

    python cluster/fakegpu.py up [--nodes N] [--gpus 8] [--dir DIR]
    python cluster/fakegpu.py up --nodes 0 --cpu-nodes 0 --real-nodes 2 --real-gpus 2   # real pods
    python cluster/fakegpu.py status [--dir DIR]
    python cluster/fakegpu.py down [--dir DIR]

What runs (all built from published Go modules by cluster/build.sh, versions in cluster/versions.env):
etcd, kube-apiserver (TLS on 127.0.0.1, client certificates, authorization Node,RBAC),
kube-controller-manager, kube-scheduler, the kwok controller (simulates the kubelets of the fake
nodes: node heartbeats, pods Running/Ready, pod deletion) and the KubeRay operator (a local process).

N fake GPU nodes ``gpu-node-<i>`` advertise ``nvidia.com/gpu`` and carry the taint
``nvidia.com/gpu:NoSchedule``; one ``cpu-node-0`` (no GPUs, no taint) takes the Ray head.

With ``--real-nodes N`` (cluster/realnodes.py) the whole cluster moves into a network namespace of
its own and gains N real GPU nodes plus ``--real-cpu-nodes`` (default 1) real CPU nodes: kubelets
with their own containerd that run real containers from a locally built image.

``DIR/kubeconfig`` is a cluster-admin kubeconfig; ``DIR/state.json`` records PIDs, ports and paths;
logs go to ``DIR/logs/``. ``down`` stops the recorded processes by PID (SIGTERM, then SIGKILL),
never by name.

Importable: ``up(...) -> Cluster``, ``down(dir)``, ``status(dir)`` (stdlib only, plus the
``cryptography`` package for certificates). The parts, by topic, beside this file: ``testbed.py`` (shared
constants, errors, the state file), ``toolchain.py`` (versions, cache, build), ``pki.py``, ``procs.py``,
``kubeapi.py`` (the API client and the waits), ``fakenodes.py``, ``controlplane.py`` (``up``'s phases); this
module keeps their names (the ``_``-prefixed ones too: cluster/kueue.py, cluster/polyaxon_stack.py,
cluster/realnodes.py and the tests use them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # cluster/ holds scripts, not a package: the parts are modules beside this one
    sys.path.insert(0, str(HERE))

import controlplane  # noqa: E402
from fakenodes import create_node, node_ip, node_manifest, node_ready, node_schedulable  # noqa: E402
from kubeapi import DEADLINE, Api, http_ok, wait  # noqa: E402
from pki import make_pki, write_kubeconfig  # noqa: E402
from procs import (free_ports, is_ours_and_alive, pdeathsig, proc_starttime, proc_state, start, stop,  # noqa: E402
                   tail)
from testbed import (BUILD_SH, COMPONENTS, DEFAULT_DIR, FAKE_GPU_MEMORY_MIB, GPU_RESOURCE,  # noqa: E402
                     KWOK_ANNOTATION, POD_CIDR, SERVICE_CIDR, SERVICE_IP, VERSIONS_FILE, FakeGPUError,
                     ToolchainMissing, log_stderr, read_state, remove_paths, write_state)
from toolchain import all_cached, artifact_paths, cache_dir, ensure_built, find_go, read_versions  # noqa: E402

# The names this module has always had, for its users (cluster/kueue.py, cluster/polyaxon_stack.py,
# cluster/realnodes.py through the module it is given, tests/infra, tests/reliability, benchmarks).
_pki, _kubeconfig = make_pki, write_kubeconfig
_proc_starttime, _proc_state, _is_ours_and_alive, _pdeathsig = proc_starttime, proc_state, is_ours_and_alive, pdeathsig
_start, _stop, _tail = start, stop, tail
_http_ok, _wait, _DEADLINE = http_ok, wait, DEADLINE
_node_ip, _create_node, _node_ready, _node_schedulable = node_ip, create_node, node_ready, node_schedulable
_read_state, _write_state = read_state, write_state
__all__ = ["BUILD_SH", "COMPONENTS", "DEFAULT_DIR", "FAKE_GPU_MEMORY_MIB", "GPU_RESOURCE", "KWOK_ANNOTATION",
           "POD_CIDR", "SERVICE_CIDR", "SERVICE_IP", "VERSIONS_FILE", "Api", "Cluster", "FakeGPUError",
           "ToolchainMissing", "all_cached", "artifact_paths", "cache_dir", "down", "ensure_built", "find_go",
           "free_ports", "log_stderr", "main", "node_manifest", "read_versions", "remove_paths", "status", "up"]


@dataclass
class Cluster:
    dir: Path
    kubeconfig: Path
    nodes: list[str]
    gpu_nodes: list[str]
    cpu_nodes: list[str]
    gpus_per_node: int
    server: str
    state: dict[str, Any] = field(repr=False, default_factory=dict)
    real_gpu_nodes: list[str] = field(default_factory=list)
    real_cpu_nodes: list[str] = field(default_factory=list)
    pod_image: str | None = None  # real nodes: the local pod image, repo:tag@sha256:digest

    def down(self, timeout: float = 15) -> dict[str, str]:
        return down(self.dir, timeout=timeout)

    @property
    def pids(self) -> dict[str, int]:
        return {k: v["pid"] for k, v in self.state.get("processes", {}).items()}


def _realnodes() -> Any:
    """cluster/realnodes.py, loaded once (it extends this module: real kubelets and containerd)."""
    import importlib.util

    name = "miles_ray_realnodes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "realnodes.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def up(
    dir: str | Path = DEFAULT_DIR,
    nodes: int = 4,
    gpus: int = 8,
    cpu_nodes: int = 1,
    timeout: float = 240,
    build: bool = True,
    log: Callable[[str], None] = log_stderr,
    die_with_parent: bool = False,
    real_nodes: int = 0,
    real_cpu_nodes: int = 0,
    real_gpus: int = 2,
) -> Cluster:
    """Start the control plane in ``dir`` and wait until it is ready.

    ``die_with_parent``: the started processes get SIGTERM if the calling process dies (for test
    fixtures: a killed pytest leaves nothing behind). The CLI ``up`` leaves them running.

    ``real_nodes``/``real_cpu_nodes`` > 0: everything runs in a network namespace of its own, plus
    that many real GPU nodes (``real_gpus`` fake ``nvidia.com/gpu`` each) and real CPU nodes
    (cluster/realnodes.py); the apiserver stays reachable at the same URL from the machine.

    In phases (cluster/controlplane.py): refuse a running one, build, a fresh dir and its PKI, then etcd, the
    API server, the controllers, the CRDs, the nodes, the operator, everything ready, and the real nodes; a
    failed phase stops what the earlier ones started."""
    d = Path(dir).resolve()
    rn = _realnodes() if real_nodes or real_cpu_nodes else None
    me = sys.modules[__name__]
    controlplane.refuse_running(d, rn)
    timings: dict[str, float] = {}
    controlplane.build(me, rn, build, log, timings)
    t_up = time.monotonic()
    DEADLINE[0] = t_up + timeout
    boot = controlplane.prepare(d, nodes, gpus, cpu_nodes, die_with_parent, timings)
    if rn:
        boot.real = rn.RealCluster(me, d, real_nodes, real_cpu_nodes, real_gpus, die_with_parent,
                                   lambda: write_state(d, boot.state), log)
        boot.state["real"] = boot.real.state
    controlplane.certificates(boot)
    try:
        controlplane.start_netns(boot)
        controlplane.start_etcd(boot)
        controlplane.start_apiserver(boot)
        controlplane.start_controllers(boot)
        controlplane.create_crds(boot)
        controlplane.create_nodes(boot)
        controlplane.start_operator(boot)
        controlplane.wait_ready(boot)
        controlplane.start_real_nodes(boot)
    except BaseException:
        DEADLINE[0] = float("inf")
        controlplane.undo(me, rn, boot, log)
        raise

    DEADLINE[0] = float("inf")
    timings["up_total"] = time.monotonic() - t_up
    boot.state["ready"] = True
    boot.state["timings"] = timings
    write_state(d, boot.state)
    real = boot.real
    real_nodes_by_role = {
        role: [n["name"] for n in (real.state["nodes"] if real else []) if n["role"] == role] for role in ("gpu", "cpu")
    }
    return Cluster(
        dir=d,
        kubeconfig=d / "kubeconfig",
        nodes=boot.gpu_nodes + boot.cpu_nodes + real_nodes_by_role["gpu"] + real_nodes_by_role["cpu"],
        gpu_nodes=boot.gpu_nodes,
        cpu_nodes=boot.cpu_nodes,
        gpus_per_node=gpus,
        server=boot.server,
        state=boot.state,
        real_gpu_nodes=real_nodes_by_role["gpu"],
        real_cpu_nodes=real_nodes_by_role["cpu"],
        pod_image=real.state["images"]["ray"]["ref"] if real else None,
    )


def down(dir: str | Path = DEFAULT_DIR, timeout: float = 15, log: Callable[[str], None] = log_stderr) -> dict[str, str]:
    d = Path(dir).resolve()
    state = read_state(d)
    if not state:
        return {}
    procs = state.get("processes", {})
    real = state.get("real")
    me = sys.modules[__name__]
    result: dict[str, str] = {}
    if real:  # pods, kubelets and containerd first, while the apiserver still answers
        result.update(_realnodes().stop_nodes(me, d, real, log))
    t = time.monotonic()
    for name in reversed([c for c in COMPONENTS if c in procs] + [c for c in procs if c not in COMPONENTS]):
        result[name] = stop(name, procs[name], timeout, log)
    if real:
        real.setdefault("teardown_timings", {})["control-plane"] = round(time.monotonic() - t, 1)
    if real:  # then the DNS stub, the relay and the namespace itself
        t = time.monotonic()
        result.update(_realnodes().stop_netns(me, d, real, log))
        real.setdefault("teardown_timings", {})["netns"] = round(time.monotonic() - t, 1)
        state["leftovers"] = _realnodes().leftovers(d, real, me)
    state["ready"] = False
    state["stopped"] = result
    write_state(d, state)
    return result


def status(dir: str | Path = DEFAULT_DIR) -> dict[str, Any]:
    d = Path(dir).resolve()
    state = read_state(d)
    if not state:
        return {"dir": str(d), "running": False, "error": "no state.json"}
    out: dict[str, Any] = {"dir": str(d), "kubeconfig": state.get("kubeconfig"), "server": state.get("server")}
    recs = dict(state.get("processes", {}), **(state.get("real") or {}).get("processes", {}))
    procs = {name: {"pid": r["pid"], "alive": is_ours_and_alive(r)} for name, r in recs.items()}
    out["processes"] = procs
    out["running"] = bool(procs) and all(p["alive"] for p in procs.values())
    if out["running"]:
        try:
            api = Api(state["server"], d / "pki")
            code, _ = api.request("GET", "/readyz", timeout=3)
            out["apiserver_ready"] = code == 200
            code, body = api.request("GET", "/api/v1/nodes", timeout=5)
            out["nodes"] = [
                {
                    "name": n["metadata"]["name"],
                    "ready": node_ready(n),
                    "gpus": n.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0"),
                }
                for n in (body or {}).get("items", [])
            ] if code == 200 else []
        except (OSError, urllib.error.URLError) as e:
            out["apiserver_ready"] = False
            out["error"] = str(e)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fakegpu.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pu = sub.add_parser("up", help="build if needed, start, wait until ready")
    pu.add_argument("--nodes", type=int, default=4, help="number of fake GPU nodes (default 4)")
    pu.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per GPU node (default 8)")
    pu.add_argument("--cpu-nodes", type=int, default=1, help="number of CPU-only nodes (default 1)")
    pu.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    pu.add_argument("--timeout", type=float, default=240, help="seconds from start to ready (default 240)")
    pu.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    pu.add_argument("--real-nodes", type=int, default=0,
                    help="real GPU nodes (kubelet + containerd, real pods), in a network namespace of their own")
    pu.add_argument("--real-gpus", type=int, default=2, help="fake nvidia.com/gpu per real GPU node (default 2)")
    pu.add_argument("--real-cpu-nodes", type=int, default=None,
                    help="real CPU nodes for the Ray head (default 1 with --real-nodes, else 0)")
    pd = sub.add_parser("down", help="stop everything recorded in DIR/state.json, by PID")
    pd.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    pd.add_argument("--timeout", type=float, default=15, help="seconds between SIGTERM and SIGKILL")
    ps = sub.add_parser("status", help="show processes and nodes")
    ps.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = p.parse_args(argv)

    try:
        if args.cmd == "up":
            t = time.monotonic()
            real_cpu = args.real_cpu_nodes if args.real_cpu_nodes is not None else (1 if args.real_nodes else 0)
            c = up(args.dir, nodes=args.nodes, gpus=args.gpus, cpu_nodes=args.cpu_nodes,
                   timeout=args.timeout, build=not args.no_build,
                   real_nodes=args.real_nodes, real_cpu_nodes=real_cpu, real_gpus=args.real_gpus)
            print(f"ready in {time.monotonic() - t:.1f}s: {len(c.gpu_nodes)} GPU nodes x {c.gpus_per_node} "
                  f"{GPU_RESOURCE} + {len(c.cpu_nodes)} CPU node(s)")
            if c.real_gpu_nodes or c.real_cpu_nodes:
                print(f"real nodes: {', '.join(c.real_cpu_nodes + c.real_gpu_nodes)} "
                      f"({args.real_gpus} {GPU_RESOURCE} per GPU node); pod image (imagePullPolicy Never): "
                      f"{c.pod_image}")
            print(f"export KUBECONFIG={c.kubeconfig}")
            kubectl = cache_dir() / "bin" / f"kubectl-{read_versions()['KUBERNETES_VERSION']}"
            if kubectl.exists():
                print(f"kubectl (matching version): {kubectl}")
            print(f"state: {c.dir / 'state.json'}  logs: {c.dir / 'logs'}")
            return 0
        if args.cmd == "down":
            res = down(args.dir, timeout=args.timeout)
            if not res:
                print(f"nothing recorded in {args.dir}")
            for name, what in res.items():
                print(f"{name:26s} {what}")
            left = {k: v for k, v in ((read_state(Path(args.dir).resolve()) or {}).get("leftovers") or {}).items() if v}
            if left:
                log_stderr(f"ERROR: left behind: {json.dumps(left)}")
                return 1
            return 0
        if args.cmd == "status":
            st = status(args.dir)
            print(json.dumps(st, indent=2))
            return 0 if st.get("running") else 1
    except ToolchainMissing as e:
        log_stderr(f"ERROR: {e}")
        return 3
    except FakeGPUError as e:
        log_stderr(f"ERROR: {e}")
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
