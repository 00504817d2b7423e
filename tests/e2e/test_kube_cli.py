"""miles-ray against a real Kubernetes API server with the real KubeRay operator and fake GPU nodes
(cluster/fakegpu.py). Ray itself does not run inside kwok pods, so these tests stop at "pods ready and
the RayCluster reports ready" (--no-ray-check); the Ray side is covered by the embedded-Ray tests."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.e2e

RAY = "2.60.0"


def kube_args(namespace: str, name: str = "miles-e2e") -> list[str]:
    return ["--namespace", namespace, "--name", name]


def up_args(namespace: str, nodes: int, name: str = "miles-e2e") -> list[str]:
    return ["up", "--via", "kuberay", "--nodes", str(nodes), "--image", IMAGE, "--ray-version", RAY,
            "--no-ray-check", "--timeout", "120", *kube_args(namespace, name)]


def worker_pods(core_v1, namespace: str, name: str = "miles-e2e") -> list[Any]:
    pods = core_v1.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name},ray.io/node-type=worker").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def rayclusters(custom_objects, namespace: str) -> list[dict]:
    return custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]


def test_up_scale_status_down(kube_env, cli, core_v1, custom_objects, namespace, shared_volume, wait_for):
    code, out, err = cli(*up_args(namespace, 4))
    assert code == 0, err
    workers = worker_pods(core_v1, namespace)
    assert len(workers) == 4
    nodes = {p.spec.node_name for p in workers}
    assert len(nodes) == 4 and all(n.startswith("gpu-node-") for n in nodes), nodes
    assert all(p.status.phase == "Running" for p in workers)
    [head] = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e,ray.io/node-type=head").items
    assert not head.spec.node_name.startswith("gpu-node-")  # the head asks for no GPU
    [rc] = rayclusters(custom_objects, namespace)
    assert rc["status"]["readyWorkerReplicas"] == 4

    code, out, err = cli("status", "-o", "json", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 0, err
    st = json.loads(out)
    assert (st["ready_workers"], st["desired_workers"], st["ready_gpus"], st["desired_gpus"]) == (4, 4, 32, 32)

    # up again: no second cluster, no change
    code, out, err = cli(*up_args(namespace, 4))
    assert code == 0, err
    assert len(rayclusters(custom_objects, namespace)) == 1
    # up of another size: refused (exit 2) naming the verb that changes it, as on the local backend
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 2 and "replicas 4 != 2" in err and "'miles-ray scale --nodes 2'" in err, err
    assert one_error_line(err)
    [rc] = rayclusters(custom_objects, namespace)
    assert rc["spec"]["workerGroupSpecs"][0]["replicas"] == 4

    code, out, err = cli("scale", "--nodes", "6", "--no-ray-check", "--timeout", "120", "-o", "json", *kube_args(namespace))
    assert code == 0, err
    result = json.loads(out)
    assert result["from"] == 4 and result["to"] == 6 and result["ready_workers"] == 6
    assert "maxReplicas 4 -> 6" in result["adjusted"]
    assert len({p.spec.node_name for p in worker_pods(core_v1, namespace)}) == 6
    [rc] = rayclusters(custom_objects, namespace)
    group = rc["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["maxReplicas"]) == (6, 6)

    code, out, err = cli("scale", "--nodes", "3", "--no-ray-check", "--timeout", "120", "-o", "json", *kube_args(namespace))
    assert code == 0, err
    assert json.loads(out)["ready_workers"] == 3
    wait_for("3 worker pods", lambda: len(worker_pods(core_v1, namespace)) == 3, timeout=60)
    [rc] = rayclusters(custom_objects, namespace)
    assert rc["spec"]["workerGroupSpecs"][0]["minReplicas"] == 3

    # down: asks without --yes (no terminal here: refuses), then deletes with --yes; storage stays
    code, _, err = cli("down", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 2 and "--yes" in err
    assert len(rayclusters(custom_objects, namespace)) == 1
    code, out, err = cli("down", "--backend", "kubernetes", "-y", "-o", "json", *kube_args(namespace))
    assert code == 0, err
    assert rayclusters(custom_objects, namespace) == []
    wait_for("pods gone", lambda: not core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e").items)
    assert core_v1.read_namespaced_persistent_volume_claim("miles-data", namespace).status.phase == "Bound"
    # down again: already down is what 'down' wants (a 'trap "miles-ray down -y" EXIT' clean-up exits 0)
    code, out, err = cli("down", "--backend", "kubernetes", "-y", "-o", "json", *kube_args(namespace))
    assert code == 0 and json.loads(out)["already_down"] is True, err
    code, _, err = cli("down", "--backend", "kubernetes", "-y", *kube_args(namespace))
    assert code == 0 and "was already down (kubernetes)" in err, err


def test_client_dry_run_contacts_nothing_server_dry_run_checks(kube_env, cli, custom_objects, namespace):
    """--dry-run client renders and validates only (a namespace that does not exist is not looked at); the
    server dry run runs the preflight and refuses it."""
    code, out, err = cli(*up_args("no-such-namespace", 2), "--dry-run", "client", "-o", "json")
    assert code == 0 and json.loads(out)["preflight"] == {"skipped": "client dry run"}, err
    assert "nothing contacted" in err
    code, _, err = cli(*up_args("no-such-namespace", 2), "--dry-run", "server")
    assert code == 1 and "namespace 'no-such-namespace' does not exist" in err


def test_preflight_refuses_more_gpu_nodes_than_exist(kube_env, cli, custom_objects, namespace, shared_volume):
    n = len(kube_env.gpu_nodes) + 2
    n += n % 2  # keep the Qwen3-4B split feasible (even node counts are)
    code, _, err = cli(*up_args(namespace, n))
    assert code == 1
    assert f"need {n} with 8 free nvidia.com/gpu" in err and f"{len(kube_env.gpu_nodes)} node(s) have nvidia.com/gpu" in err
    assert one_error_line(err)
    assert rayclusters(custom_objects, namespace) == []


def test_preflight_namespace_and_claim(kube_env, cli, custom_objects, namespace):
    code, _, err = cli(*up_args("no-such-namespace", 2))
    assert code == 1 and "namespace 'no-such-namespace' does not exist" in err
    code, _, err = cli(*up_args(namespace, 2))  # no PVC in this namespace
    assert code == 1 and f"PersistentVolumeClaim {namespace}/miles-data does not exist" in err
    assert rayclusters(custom_objects, namespace) == []


def test_server_dry_run_creates_nothing(kube_env, cli, custom_objects, namespace, shared_volume):
    code, out, err = cli(*up_args(namespace, 2), "--dry-run", "server")
    assert code == 0, err
    assert "nothing created" in out
    assert rayclusters(custom_objects, namespace) == []


@pytest.mark.parametrize("dry_run", ["client", "server"])
def test_dry_run_returns_what_render_prints(kube_env, cli, custom_objects, namespace, shared_volume, dry_run):
    """One document pipeline: the RayCluster 'up --via kuberay' would create is, byte for byte, the one
    'render -F kuberay' prints for the same flags."""
    flags = ["--layout", "disaggregated", "--rollout-nodes", "1"]
    code, out, err = cli(*up_args(namespace, 2), *flags, "--dry-run", dry_run, "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["created"] is False and result["dry_run"] == dry_run
    code, rendered, err = cli("render", "-F", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY,
                              *kube_args(namespace), *flags, "-o", "json")
    assert code == 0, err
    assert result["raycluster"] == json.loads(rendered)
    assert rayclusters(custom_objects, namespace) == []


def test_unschedulable_pod_reported_with_reason(kube_env, cli, core_v1, custom_objects, namespace):
    from kubernetes import client

    # a claim that exists but can never bind: preflight passes, the scheduler refuses the pods
    core_v1.create_namespaced_persistent_volume_claim(namespace, client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name="miles-data"),
        spec=client.V1PersistentVolumeClaimSpec(access_modes=["ReadWriteMany"], storage_class_name="",
                                                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Ti"}))))
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 1
    assert "cannot be scheduled" in err and "PersistentVolumeClaim" in err
    assert one_error_line(err)


def test_scale_errors(kube_env, cli, namespace, shared_volume):
    code, _, err = cli("scale", "--nodes", "2", "--backend", "kubernetes", *kube_args(namespace, "nothing-here"))
    assert code == 1 and "no RayCluster" in err
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    code, _, err = cli("scale", "--nodes", "2", "--backend", "kubernetes", *kube_args(namespace),
                       "--no-wait", "-c", _config_with(kube_env, "worker_group: nope\n"))
    assert code == 2 and "no worker group 'nope'" in err and "gpu" in err
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))


def _config_with(kube_env, text: str) -> str:
    from pathlib import Path

    p = Path.cwd() / f"cfg-{uuid.uuid4().hex[:6]}.yaml"
    p.write_text(text)
    return str(p)


def test_scale_conflict_is_retried_on_fresh_state(kube_env, k8s_api, custom_objects, namespace, shared_volume, cli):
    """Another writer changes the RayCluster between our read and our patch: the server rejects the
    guarded patch and the scale is retried on fresh state."""
    from miles_ray.adapters import kube

    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    rays = kube.RayClusters(k8s_api)
    real_get = rays.get
    calls = {"n": 0}

    def racing_get(ns, name):
        obj = real_get(ns, name)
        calls["n"] += 1
        if calls["n"] == 1:  # someone else writes right after our first read
            custom_objects.patch_namespaced_custom_object(
                "ray.io", "v1", ns, "rayclusters", name, {"metadata": {"annotations": {"touched": "yes"}}})
        return obj

    rays.get = racing_get
    retries: list[str] = []
    patched, notes = rays.set_replicas(namespace, "miles-e2e", "gpu", 3, on_retry=retries.append)
    assert retries and "retrying" in retries[0]
    assert calls["n"] >= 2
    assert patched["spec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert patched["metadata"]["annotations"]["touched"] == "yes"  # the other writer's change survived
    assert notes == ["maxReplicas 2 -> 3"]


def test_concurrent_scales_end_consistent(kube_env, k8s_api, custom_objects, namespace, shared_volume, cli):
    from miles_ray.adapters import kube

    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    results: dict[int, Any] = {}

    def scale(n: int) -> None:
        try:
            results[n] = kube.RayClusters(k8s_api).set_replicas(namespace, "miles-e2e", "gpu", n)
        except Exception as e:  # noqa: BLE001
            results[n] = e

    threads = [threading.Thread(target=scale, args=(n,)) for n in (3, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(not isinstance(r, Exception) for r in results.values()), results
    # Each write is guarded by the resourceVersion it read, so the two land one after the other: the one
    # with the higher generation landed last, and its replicas are what the cluster holds.
    generations = {n: patched["metadata"]["generation"] for n, (patched, _) in results.items()}
    assert len(set(generations.values())) == 2, generations
    last = max(generations, key=generations.get)
    [rc] = rayclusters(custom_objects, namespace)
    g = rc["spec"]["workerGroupSpecs"][0]
    assert rc["metadata"]["generation"] == generations[last]
    assert g["replicas"] == last
    assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]


def test_missing_kubeconfig_and_context(cli, monkeypatch, tmp_path, fake_k8s):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(*up_args("default", 2), "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2 and "kubeconfig" in err and "does not exist" in err
    code, _, err = cli(*up_args("default", 2), "--kubeconfig", str(fake_k8s.kubeconfig), "--context", "no-such-ctx")
    assert code == 2 and "context 'no-such-ctx'" in err


def one_error_line(err: str) -> bool:
    """Progress lines may precede it; the failure itself is exactly one 'error:' line, no traceback."""
    return sum(1 for line in err.splitlines() if line.startswith("error:")) == 1 and "Traceback" not in err
