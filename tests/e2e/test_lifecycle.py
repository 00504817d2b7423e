"""Cluster lifecycle on the fake-GPU control plane (a real API server, the real KubeRay operator, kwok GPU
nodes): the autoscaler refusal of 'scale', park and resume. kwok pods run no Ray, so every wait here stops at
"pods ready and the RayCluster reports ready" (--no-ray-check, as 'up' in tests/e2e/test_kube_cli.py); that
every GPU worker rejoins Ray after 'resume' is shown on real pods (tests/realpods)."""

from __future__ import annotations

import copy
import pytest

from tests.e2e.test_kube_cli import kube_args, up_args, worker_pods

pytestmark = pytest.mark.e2e


def _get(custom_objects, namespace: str, name: str) -> dict:
    return custom_objects.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", name)


def test_scale_refuses_a_cluster_the_autoscaler_manages(kube_env, cli, core_v1, custom_objects, namespace,
                                                         shared_volume):
    code, _, err = cli(*up_args(namespace, 1))
    assert code == 0, err
    made = _get(custom_objects, namespace, "miles-e2e")
    assert made["spec"]["enableInTreeAutoscaling"] is False  # clusters made by 'up' never turn it on

    # a RayCluster someone made with KubeRay's in-tree autoscaler on (same pods otherwise)
    body = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "autoscaled", "namespace": namespace}, "spec": copy.deepcopy(made["spec"])}
    body["spec"]["enableInTreeAutoscaling"] = True
    body["spec"]["workerGroupSpecs"][0].update(replicas=1, minReplicas=1, maxReplicas=4)
    custom_objects.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", body)
    before = _get(custom_objects, namespace, "autoscaled")

    code, out, err = cli("scale", "--nodes", "3", "--backend", "kubernetes", "--no-ray-check", "--timeout", "60",
                         *kube_args(namespace, "autoscaled"))
    assert code == 1 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("error: RayCluster") and "in-tree autoscaler (spec.enableInTreeAutoscaling: true)" in line
    assert "minReplicas/maxReplicas" in line and "enableInTreeAutoscaling: false" in line
    after = _get(custom_objects, namespace, "autoscaled")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["workerGroupSpecs"][0]["replicas"] == 1

    # the cluster made by 'up' still scales
    code, _, err = cli("scale", "--nodes", "2", "--backend", "kubernetes", "--no-ray-check", "--timeout", "120",
                       *kube_args(namespace))
    assert code == 0, err
    assert len(worker_pods(core_v1, namespace)) == 2
    custom_objects.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "autoscaled")
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))
