"""A real-pod cluster for tests: the fake-GPU control plane plus real kubelets and containerd.

``start_real_pods(d)`` starts, in a network namespace of its own (cluster/realnodes.py), the control
plane, one small real CPU node for the Ray head (``real-cpu-0``) and real GPU nodes
(``real-gpu-<i>``, fake ``nvidia.com/gpu``), no kwok node; ``RealPods.stop()`` tears it all down and
returns a ``Teardown`` that says what, if anything, is left on the machine. ``real_pods`` is the
session fixture over them for the ``real_pods`` tier; its teardown fails if anything is left.

The test process reaches the apiserver at ``cluster.server`` (https://127.0.0.1:<port>) through
``nsrelay.py``, a relay from the machine's loopback into the namespace; pods and Ray heads are
reached through the apiserver (port-forward, exec, logs), as a user would.

Environment:
  MILESRAY_TEST_STRICT=1   fail (instead of skip) when real pods cannot run here (as every tier).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.infra import knobs

from tests.infra.scripts import load_script

fakegpu = load_script("cluster/fakegpu.py", "miles_ray_fakegpu")
realnodes = fakegpu._realnodes()

SUMMARY: list[str] = []  # lines for the run's terminal summary (tests/realpods/conftest.py)

REAL_GPU_NODES = 2
REAL_GPUS = 2
REAL_CPU_NODES = 1


def skip_or_fail(reason: str) -> None:
    """Skip loudly (a failure under MILESRAY_TEST_STRICT=1, as every real-component tier)."""
    knobs.unavailable("real pods", reason)


def why_not_here() -> str | None:
    """Why real pods cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces, cgroups)"
    if not realnodes.cgroup_hierarchies():
        return "needs cgroup v1 hierarchies (the kubelet here runs with failCgroupV1: false)"
    try:
        import kubernetes  # noqa: F401
    except ImportError as e:
        return f"python package 'kubernetes' is not importable: {e}"
    return None


@dataclass
class Teardown:
    """What ``stop()`` did and what it left: every list in ``leftovers`` empty and ``host_changes``
    empty means nothing of the cluster remains on the machine."""

    seconds: float
    stopped: dict[str, str]
    leftovers: dict[str, list[Any]]
    host_changes: dict[str, Any]

    @property
    def clean(self) -> bool:
        return not any(self.leftovers.values()) and not self.host_changes


@dataclass
class RealPods:
    cluster: Any  # fakegpu.Cluster
    host_before: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    teardown: Teardown | None = None

    @property
    def dir(self) -> Path:
        return self.cluster.dir

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def image(self) -> str:
        """The local pod image, ``repo:tag@sha256:<digest>`` (use imagePullPolicy Never)."""
        return self.cluster.pod_image

    @property
    def cpu_nodes(self) -> list[str]:
        return self.cluster.real_cpu_nodes

    @property
    def gpu_nodes(self) -> list[str]:
        return self.cluster.real_gpu_nodes

    @property
    def gpus_per_node(self) -> int:
        return REAL_GPUS

    @property
    def real_state(self) -> dict[str, Any]:
        return self.cluster.state["real"]

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def memory(self) -> dict[str, Any]:
        """RSS/PSS (MiB) of every process of the cluster, pods included, by group and in total."""
        return realnodes.memory(self.real_state, self.cluster.state["processes"], fakegpu)

    def stop(self) -> Teardown:
        """Stop everything by PID and check what is left (idempotent)."""
        if self.teardown is None:
            t = time.monotonic()
            stopped = fakegpu.down(self.dir)
            seconds = time.monotonic() - t
            state = fakegpu._read_state(self.dir) or {}
            after = realnodes.host_snapshot()
            changes = {k: {"before": self.host_before[k], "after": after[k]}
                       for k in self.host_before if self.host_before[k] != after[k] and k != "mounts"}
            # Mount points: only ours matter (other jobs on the machine may mount things meanwhile).
            new_mounts = [m for m in set(after["mounts"]) - set(self.host_before["mounts"])
                          if m.startswith(str(self.dir)) or m.startswith(("/run/containerd", "/var/lib/cni",
                                                                          "/var/log", "/proc/sys", "/run/netns"))]
            if new_mounts:
                changes["mounts"] = sorted(new_mounts)
            self.teardown = Teardown(seconds, stopped, state.get("leftovers") or {}, changes)
        return self.teardown

    # ---- helpers for tests
    def shared_volume(self, namespace: str, claim: str) -> Path:
        """A PersistentVolume (hostPath: one directory of the machine, the same on every node, like a
        shared filesystem) bound to PVC ``claim`` in ``namespace``; returns the directory."""
        from kubernetes import client

        path = self.dir / "volumes" / f"{namespace}-{claim}"
        path.mkdir(parents=True, exist_ok=True)
        core = client.CoreV1Api(self.api_client())
        pv_name = f"{namespace}-{claim}"
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=pv_name),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"}, access_modes=["ReadWriteMany"], storage_class_name="",
                persistent_volume_reclaim_policy="Retain",
                host_path=client.V1HostPathVolumeSource(path=str(path), type="Directory"))))
        core.create_namespaced_persistent_volume_claim(namespace, client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=claim),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteMany"], storage_class_name="", volume_name=pv_name,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
        return path


def start_real_pods(d: Path, gpu_nodes: int = REAL_GPU_NODES, gpus: int = REAL_GPUS,
                    cpu_nodes: int = REAL_CPU_NODES) -> RealPods:
    """Build what is missing (cold, after the control plane: ~1.5 min quiet, ~4.5 min loaded), then start; skips
    (or fails, see MILESRAY_TEST_STRICT) where real pods cannot run."""
    reason = why_not_here()
    if reason:
        skip_or_fail(reason)
    if fakegpu.find_go() is None and not (fakegpu.all_cached() and os.access(
            realnodes.artifact_paths(fakegpu)["kubelet"], os.X_OK)):
        skip_or_fail(f"the Kubernetes binaries are not cached in {fakegpu.cache_dir()} and no Go toolchain "
                     "is installed to build them (install Go >= 1.26, then run cluster/build.sh real-nodes)")
    t = time.monotonic()
    try:
        # Build (and install the pinned Debian runtime: containerd, runc, iptables ...) before the host
        # snapshot: on a fresh machine iptables-save only exists afterwards, and "not installed" then "no
        # rules" is not something the cluster left behind.
        fakegpu.ensure_built()
        realnodes.ensure_built(fakegpu, fakegpu.log_stderr)
    except fakegpu.ToolchainMissing as e:
        skip_or_fail(str(e))
        raise  # unreachable
    build_seconds = time.monotonic() - t
    before = realnodes.host_snapshot()
    t = time.monotonic()
    try:
        cluster = fakegpu.up(d, nodes=0, cpu_nodes=0, real_nodes=gpu_nodes, real_cpu_nodes=cpu_nodes,
                             real_gpus=gpus, die_with_parent=True, timeout=600, build=False)  # built above
    except fakegpu.ToolchainMissing as e:
        skip_or_fail(str(e))
        raise  # unreachable
    rp = RealPods(cluster, before)
    timings = cluster.state.get("timings", {})
    rp.figures["up_seconds"] = round(time.monotonic() - t, 1)
    rp.figures["up_build_seconds"] = round(build_seconds, 1)
    rp.figures["up_timings"] = {k: round(v, 1) for k, v in timings.items()}
    return rp


@pytest.fixture(scope="session")
def real_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPods]:
    """A running real-pod cluster for the whole session; stopped afterwards, and the session
    errors if anything of it is left on the machine."""
    rp = start_real_pods(tmp_path_factory.mktemp("realpods"))
    try:
        yield rp
    finally:
        td = rp.stop()
        if not td.clean:
            pytest.fail(f"the real-pod cluster left things behind: leftovers={td.leftovers} "
                        f"host changes={td.host_changes}", pytrace=False)
