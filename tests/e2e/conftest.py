"""Fixtures for end-to-end tests against the real fake-GPU Kubernetes control plane (cluster/).

``fake_k8s`` (session scope) starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok and the KubeRay operator from binaries cached by ``cluster/build.sh`` (building them first if
needed: many minutes on a cold cache), in a temporary directory, and stops them by PID afterwards.

Environment:
  MILES_RAY_REQUIRE_E2E=1   fail (instead of skip) when the control plane cannot be built/started
                            for want of a Go toolchain.
  MILES_RAY_E2E_NODES=N     number of fake GPU nodes (default 6), plus one CPU node.
  MILES_RAY_E2E_GPUS=G      nvidia.com/gpu per GPU node (default 8).
  MILES_RAY_CACHE=DIR       binary cache (default ~/.cache/miles-ray).
  MILES_RAY_E2E_KEEP=1      leave the cluster running after the session (prints how to stop it).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.infra.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
FAKEGPU_PY = REPO / "cluster" / "fakegpu.py"


fakegpu = load_script("cluster/fakegpu.py", "miles_ray_fakegpu")


def _required() -> bool:
    return os.environ.get("MILES_RAY_REQUIRE_E2E", "") not in ("", "0", "false", "no")


def _skip_or_fail(reason: str) -> None:
    banner = "\n" + "!" * 100 + f"\n!! E2E SKIPPED: {reason}\n" + "!" * 100
    if _required():
        pytest.fail(f"MILES_RAY_REQUIRE_E2E=1 but the e2e control plane is unavailable: {reason}", pytrace=False)
    print(banner, file=sys.stderr)
    warnings.warn(pytest.PytestWarning(f"E2E SKIPPED: {reason}"), stacklevel=2)
    pytest.skip(f"e2e control plane unavailable (set MILES_RAY_REQUIRE_E2E=1 to fail instead): {reason}")


@pytest.fixture(scope="session")
def fake_k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running control plane: ``.kubeconfig``, ``.nodes``, ``.gpu_nodes``, ``.cpu_nodes``,
    ``.gpus_per_node``, ``.server``, ``.dir``, ``.pids``."""
    try:
        import kubernetes  # noqa: F401
    except ImportError as e:  # the project depends on it; only a broken venv gets here
        _skip_or_fail(f"python package 'kubernetes' is not importable: {e}")

    if not fakegpu.all_cached() and fakegpu.find_go() is None:
        _skip_or_fail(
            "the control plane binaries are not cached in "
            f"{fakegpu.cache_dir()} and no Go toolchain is installed to build them "
            "(install Go >= 1.26 or put it on PATH / $GO, then run cluster/build.sh)"
        )

    nodes = int(os.environ.get("MILES_RAY_E2E_NODES", "6"))
    gpus = int(os.environ.get("MILES_RAY_E2E_GPUS", "8"))
    d = tmp_path_factory.mktemp("fakegpu")
    try:
        # die_with_parent: if this pytest process is killed, the control plane goes with it.
        keep = bool(os.environ.get("MILES_RAY_E2E_KEEP"))
        cluster = fakegpu.up(d, nodes=nodes, gpus=gpus, die_with_parent=not keep)
    except fakegpu.ToolchainMissing as e:
        _skip_or_fail(str(e))
        raise  # unreachable
    try:
        yield cluster
    finally:
        if os.environ.get("MILES_RAY_E2E_KEEP"):
            print(f"\nfake_k8s left running: python {FAKEGPU_PY} down --dir {d}", file=sys.stderr)
        else:
            fakegpu.down(d)


# --------------------------------------------------------------------------------------------
# Kubernetes clients and small helpers for the tests


@pytest.fixture(scope="session")
def k8s_api(fake_k8s: Any) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(fake_k8s.kubeconfig))


@pytest.fixture(scope="session")
def core_v1(k8s_api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(k8s_api)


@pytest.fixture(scope="session")
def custom_objects(k8s_api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(k8s_api)


def _wait_for(what: str, fn: Callable[[], Any], timeout: float = 60, interval: float = 0.25) -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``wait_for(what, fn, timeout=60)``: poll until ``fn()`` is truthy, return it; fail on timeout."""
    return _wait_for


@pytest.fixture
def namespace(core_v1: Any, custom_objects: Any) -> Iterator[str]:
    """A fresh namespace with its ``default`` ServiceAccount in place; deleted afterwards."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def sa_ready() -> bool:
        try:
            core_v1.read_namespaced_service_account("default", name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    _wait_for(f"ServiceAccount {name}/default", sa_ready, timeout=60)
    try:
        yield name
    finally:
        # Free its GPUs before the next test: delete the RayClusters (the operator stops making
        # pods), then the pods at once, and wait until kwok has completed their deletion. The
        # namespace itself is left to the namespace controller (that takes ~10 s; no need to wait).
        try:
            custom_objects.delete_collection_namespaced_custom_object("ray.io", "v1", name, "rayclusters")
        except ApiException:
            pass

        def no_pods() -> bool:
            pods = core_v1.list_namespaced_pod(name).items
            if pods:
                core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            return not pods

        _wait_for(f"pods of namespace {name} deleted", no_pods, timeout=60, interval=0.5)
        try:
            core_v1.delete_namespace(name)
        except ApiException:
            pass
