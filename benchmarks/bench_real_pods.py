#!/usr/bin/env python3
"""Benchmark: Ray in real pods (KubeRay on real kubelets + containerd, tests/infra/realpods.py) beside the
local backend, in one run, through the miles-ray CLI as a user runs it.

Measures, for each backend: ``up --nodes 2`` (returns when both 2-GPU workers are ALIVE in Ray), then
``submit --rehearse --no-follow`` -> the job RUNNING (Kubernetes: through miles-ray's own k8s:// port-forward
to the head pod), the rehearsal -> SUCCEEDED, and ``down``; plus the real-pod cluster's own start and stop
and its memory (PSS) with Ray running. Prints a table, ratios (Kubernetes / local), and ``BENCH_RESULT {json}``.
Needs root (network and mount namespaces) and the cached binaries and image (cluster/build.sh real-nodes).

    .venv/bin/python benchmarks/bench_real_pods.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.infra.realpods import start_real_pods  # noqa: E402

NS, NAME, GPUS = "bench", "bench", 2


def mr(env: dict[str, str], cwd: Path, *args: str, timeout: float = 900) -> tuple[float, dict]:
    """Run miles-ray; (seconds, its JSON output). Exits the benchmark with its stderr on failure."""
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "miles_ray", *args, "-o", "json"], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"miles-ray {' '.join(args)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return took, json.loads(p.stdout) if p.stdout.strip() else {}


def until_running(env: dict[str, str], cwd: Path, run: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = subprocess.run([sys.executable, "-m", "miles_ray", "status", run, "-o", "json"], env=env, cwd=cwd,
                           capture_output=True, text=True, timeout=120)
        status = json.loads(p.stdout or "{}").get("status")
        if status in ("RUNNING", "SUCCEEDED"):
            return
        if status in ("FAILED", "STOPPED"):
            sys.exit(f"run {run} ended {status}")
        time.sleep(0.2)
    sys.exit(f"run {run} not RUNNING after {timeout:.0f}s")


def until_done(env: dict[str, str], cwd: Path, run: str) -> str:
    p = subprocess.run([sys.executable, "-m", "miles_ray", "logs", run, "-f"], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=900)
    return "SUCCEEDED" if p.returncode == 0 else f"exit {p.returncode}"


def measure(env: dict[str, str], cwd: Path, up_args: list[str], down_args: list[str],
            before_down=None) -> dict:
    res: dict = {}
    res["up_s"], _ = mr(env, cwd, "up", "--nodes", "2", *up_args)
    t = time.monotonic()
    mr(env, cwd, "submit", "--rehearse", "--nodes", "2", "--run", "bench-rehearsal", "--no-follow")
    until_running(env, cwd, "bench-rehearsal")
    res["submit_to_running_s"] = time.monotonic() - t
    res["rehearsal_status"] = until_done(env, cwd, "bench-rehearsal")
    res["submit_to_done_s"] = time.monotonic() - t
    if before_down is not None:
        res.update(before_down())
    res["down_s"], _ = mr(env, cwd, "down", "-y", *down_args)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="mr-bench-realpods-"))
    base = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    for k in [k for k in base if k.startswith("MILES_RAY_")]:
        base.pop(k)
    res: dict = {"load_average_at_start": round(os.getloadavg()[0], 1)}

    # the local backend: head + 2 raylets advertising 2 fake GPUs each
    local = work / "local"
    local.mkdir()
    (local / "miles-ray.yaml").write_text(f"name: {NAME}\ngpus_per_node: {GPUS}\ncpus_per_node: {GPUS + 1}\n")
    env_local = {**base, "MILES_RAY_STATE_DIR": str(local / "state")}
    res["local"] = measure(env_local, local, ["--backend", "local"], ["--backend", "local"])

    # real pods: control plane + 1 CPU node + 2 GPU nodes (2 fake GPUs each), Ray in KubeRay's pods
    t = time.monotonic()
    rp = start_real_pods(work / "cluster")
    res["real_pods_cluster_up_s"] = round(time.monotonic() - t, 1)
    try:
        from kubernetes import client

        core = client.CoreV1Api(rp.api_client())
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        while not any(s.metadata.name == "default" for s in core.list_namespaced_service_account(NS).items):
            time.sleep(0.5)
        rp.shared_volume(NS, "miles-data")
        kube = work / "kube"
        kube.mkdir()
        (kube / "miles-ray.yaml").write_text(
            f"name: {NAME}\nnamespace: {NS}\ngpus_per_node: {GPUS}\ncpus_per_node: {GPUS + 1}\n"
            "cpu_request_per_node: 250m\nmemory_per_node: 2Gi\nhead_cpus: 1\nhead_memory: 2Gi\n"
            f"image: {rp.image}\nray_version: 2.60.0\nvolume_claim: miles-data\n")
        env_kube = {**base, "KUBECONFIG": str(rp.kubeconfig), "MILES_RAY_STATE_DIR": str(kube / "state")}
        res["kubernetes"] = measure(env_kube, kube, ["--via", "kuberay", "--timeout", "600"], ["--backend", "kubernetes"],
                                    before_down=lambda: {"cluster_pss_mib_with_ray": rp.memory()["total_mib"]["pss"]})
    finally:
        t = time.monotonic()
        td = rp.stop()
        res["real_pods_cluster_down_s"] = round(time.monotonic() - t, 1)
        res["real_pods_clean"] = td.clean

    k, lo = res["kubernetes"], res["local"]
    rows = [
        ("real-pod cluster start (control plane + 3 real nodes)", f"{res['real_pods_cluster_up_s']:.1f} s"),
        ("up --nodes 2 -> both workers ALIVE in Ray", f"kubernetes {k['up_s']:.1f} s | local {lo['up_s']:.1f} s"
                                                      f" | x{k['up_s'] / lo['up_s']:.1f}"),
        ("submit --rehearse -> RUNNING", f"kubernetes {k['submit_to_running_s']:.1f} s (k8s:// port-forward) | "
                                         f"local {lo['submit_to_running_s']:.1f} s | "
                                         f"x{k['submit_to_running_s'] / max(lo['submit_to_running_s'], 0.1):.1f}"),
        ("submit --rehearse -> done", f"kubernetes {k['submit_to_done_s']:.1f} s ({k['rehearsal_status']}) | "
                                      f"local {lo['submit_to_done_s']:.1f} s ({lo['rehearsal_status']})"),
        ("down", f"kubernetes {k['down_s']:.1f} s | local {lo['down_s']:.1f} s"),
        ("real-pod cluster memory with Ray running (PSS)", f"{k['cluster_pss_mib_with_ray'] / 1024:.2f} GiB "
                                                           "(control plane, kubelets, containerd, pods)"),
        ("real-pod cluster stop", f"{res['real_pods_cluster_down_s']:.1f} s, nothing left: {res['real_pods_clean']}"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print("BENCH_RESULT " + json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
