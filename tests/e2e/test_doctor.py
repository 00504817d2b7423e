"""`miles-ray doctor` against the real Kubernetes API server, the real KubeRay operator and kwok fake GPU
nodes (cluster/fakegpu.py): clusters are created with `miles-ray up --via kuberay`, then broken the way the
troubleshooting checklist describes, and doctor must name the problem with its evidence. Ray does not run
inside kwok pods, so the Ray-side checks (data, checkpoints, Ray version) are covered on the embedded Ray
cluster (tests/integration/test_check_data.py) and reported here as skipped."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.conftest import DIGEST
from tests.e2e.test_kube_cli import kube_args, up_args

pytestmark = pytest.mark.e2e

OTHER_IMAGE = "radixark/miles:dev@sha256:" + "7a" * 32
CHECKS = {"pods_pending", "container_failures", "shm", "gpu_visibility", "external_ray", "image_drift", "data",
          "ray_membership"}


def doctor(cli, namespace: str) -> tuple[int, dict, str]:
    code, out, err = cli("doctor", "miles-e2e", "--backend", "kubernetes", "-o", "json", *kube_args(namespace)[:2])
    assert out, err
    return code, json.loads(out), err


def by_check(rep: dict) -> dict[str, dict]:
    return {f["check"]: f for f in rep["findings"]}


def rc_get(custom_objects, namespace: str) -> dict:
    return custom_objects.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "miles-e2e")


def test_pending_pod_whose_gpus_no_node_has(kube_env, cli, core_v1, custom_objects, namespace, shared_volume,
                                            wait_for):
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    code, rep, err = doctor(cli, namespace)
    f = by_check(rep)
    assert CHECKS <= set(f), set(f)
    assert f["pods_pending"]["status"] == "ok" and f["image_drift"]["status"] == "ok"
    assert f["gpu_visibility"]["status"] == "ok" and f["external_ray"]["status"] == "ok"
    assert f["data"]["status"] == "skipped"  # kwok pods run no Ray: the port-forward to the head gets no answer
    assert f["ray_membership"]["status"] == "skipped" and "does not answer" in f["ray_membership"]["summary"]
    assert "miles-e2e-head" in " ".join(f["data"]["evidence"])  # the reason names the head pod
    assert f["shm"]["status"] == "ok", f["shm"]  # every group of miles-ray's render mounts a memory /dev/shm
    assert all(set(x) == {"check", "checklist", "status", "summary", "evidence", "fix"} for x in rep["findings"])

    # the worker group's /dev/shm mount taken away: doctor names the group (the default's 64Mi would break NCCL)
    rc = rc_get(custom_objects, namespace)
    group = rc["spec"]["workerGroupSpecs"][0]["groupName"]
    mounts = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["volumeMounts"]
    [at] = [i for i, m in enumerate(mounts) if m["mountPath"] == "/dev/shm"]
    custom_objects.patch_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "miles-e2e",
        [{"op": "test", "path": f"/spec/workerGroupSpecs/0/template/spec/containers/0/volumeMounts/{at}/mountPath",
          "value": "/dev/shm"},
         {"op": "remove", "path": f"/spec/workerGroupSpecs/0/template/spec/containers/0/volumeMounts/{at}"}],
        _content_type="application/json-patch+json")
    code, rep, err = doctor(cli, namespace)
    shm = by_check(rep)["shm"]
    assert code == 4 and shm["status"] == "problem", shm
    assert group in shm["summary"] and "headgroup" not in shm["summary"], shm

    # a second worker group asking 16 GPUs per pod, on nodes of 8
    rc = rc_get(custom_objects, namespace)
    big = copy.deepcopy(rc["spec"]["workerGroupSpecs"][0])
    big.update(groupName="big", replicas=1, minReplicas=1, maxReplicas=1)
    big["rayStartParams"]["num-gpus"] = "16"
    res = big["template"]["spec"]["containers"][0]["resources"]
    res["limits"]["nvidia.com/gpu"] = res["requests"]["nvidia.com/gpu"] = "16"
    custom_objects.patch_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "miles-e2e",
        [{"op": "add", "path": "/spec/workerGroupSpecs/-", "value": big}],
        _content_type="application/json-patch+json")

    def big_pod_unschedulable():
        pods = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e,ray.io/group=big").items
        return [p for p in pods if any(c.type == "PodScheduled" and c.status == "False"
                                       for c in p.status.conditions or [])]

    [pod] = wait_for("the 16-GPU pod to be unschedulable", big_pod_unschedulable, timeout=90)
    code, rep, err = doctor(cli, namespace)
    assert code == 4
    p = by_check(rep)["pods_pending"]
    assert p["status"] == "problem" and pod.metadata.name in p["summary"]
    ev = "\n".join(p["evidence"])
    assert f"pod {pod.metadata.name} needs 16 nvidia.com/gpu" in ev
    assert "Insufficient nvidia.com/gpu" in ev                              # the scheduler's own words
    gpu_nodes = kube_env.gpu_nodes
    assert f"GPU nodes ({len(gpu_nodes)})" in ev and "8 allocatable" in ev    # the node GPU numbers
    assert "no node can supply 16 GPUs to one pod (the largest has 8)" in p["fix"]
    assert p["checklist"] == "The pod stays Pending"
    # the table form shows the same, with evidence and the fix
    code, out, _ = cli("doctor", "miles-e2e", "--backend", "kubernetes", *kube_args(namespace)[:2])
    assert code == 4 and "pods_pending" in out and "fix:" in out and "largest has 8" in out


class OperatorLog:
    """The KubeRay operator's log (console encoder: one line per message, with the RayCluster's
    namespace/name and the reconcile's ``reconcileID``), read from a byte offset on."""

    def __init__(self, fake_k8s) -> None:
        self.path = Path(fake_k8s.state["processes"]["kuberay-operator"]["log"])
        self.offset = self.path.stat().st_size

    def reconciled(self, namespace: str, name: str) -> bool:
        """True once a reconcile of ``namespace/name`` that started after the offset has run to its end
        (``Unconditional requeue after``: KubeRay found nothing more to do). A status that changed makes
        the reconcile return early and be requeued; that one does not count."""
        with open(self.path, errors="replace") as f:
            f.seek(self.offset)
            text = f.read()
        ours = f'"RayCluster": {{"name":"{name}","namespace":"{namespace}"}}'
        return any(ours in line and "Unconditional requeue after" in line for line in text.splitlines())


def test_image_drift_after_patching_the_worker_image(kube_env, cli, core_v1, custom_objects, namespace,
                                                     shared_volume, wait_for):
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    before = {p.metadata.name for p in core_v1.list_namespaced_pod(
        namespace, label_selector="ray.io/cluster=miles-e2e,ray.io/node-type=worker").items}
    oplog = OperatorLog(kube_env)
    custom_objects.patch_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "miles-e2e",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/template/spec/containers/0/image", "value": OTHER_IMAGE}],
        _content_type="application/json-patch+json")

    # KubeRay does not bump status.observedGeneration for a template-only change, so wait for what shows that
    # it has seen the patch: the reconcile the new generation triggers, run to its end in the operator's log.
    # Then the pods must still be the old ones.
    wait_for("KubeRay to reconcile the patched RayCluster", lambda: oplog.reconciled(namespace, "miles-e2e"),
             timeout=60)
    workers = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e,ray.io/node-type=worker").items
    assert {p.metadata.name for p in workers} == before  # KubeRay did not recreate the running pods
    code, rep, err = doctor(cli, namespace)
    assert code == 4
    d = by_check(rep)["image_drift"]
    assert d["status"] == "problem"
    for p in workers:
        assert f"pod {p.metadata.name} runs radixark/miles:latest@{DIGEST} but the RayCluster's gpu template says " \
               f"{OTHER_IMAGE}" in d["summary"]
    assert "head and worker groups name different images" in d["summary"]
    assert any("imageID" in e for e in d["evidence"])  # reported, or said to be missing on kwok
    assert "recreate" in d["fix"]


def test_unknown_cluster_is_one_error_line(kube_env, cli, namespace):
    code, _, err = cli("doctor", "nothing-here", "--backend", "kubernetes", "--namespace", namespace)
    assert code == 1 and "no RayCluster" in err and err.count("error:") == 1 and "Traceback" not in err
