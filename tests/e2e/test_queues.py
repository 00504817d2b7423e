"""Queues on the real API server with the real KubeRay operator: 'up --queue' with Kueue's LocalQueue CRD served.

What is real and what is not, and why: Kueue's LocalQueue CustomResourceDefinition is the one Kueue ships (a byte
copy from its Go module, tests/data/kueue/SOURCE), installed on the test API server, so the API server serves
LocalQueues and preflight reads them for real. No Kueue CONTROLLER runs: it is a separate Go program with its own
webhooks, cert management and a dozen more CRDs (ClusterQueue, ResourceFlavor, Workload, ...), too heavy to build
and run on this 2-core machine next to the control plane. So admission itself (Kueue unsuspending the RayCluster
once the whole gang fits) is not shown here; what is shown is what miles-ray does: the label on the RayCluster,
the queue checked before anything is created, and 'park' leaving suspend to Kueue (tests/e2e/test_lifecycle.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_kube_cli import kube_args, rayclusters, up_args

pytestmark = pytest.mark.e2e

CRD = Path(__file__).resolve().parents[1] / "data" / "kueue" / "kueue.x-k8s.io_localqueues.yaml"


@pytest.fixture
def kueue_crd(k8s_api, wait_for):
    """Kueue's LocalQueue CRD served on the control plane for this test, removed afterwards."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(k8s_api)
    body = yaml.safe_load(CRD.read_text())
    ext.create_custom_resource_definition(body)
    try:
        wait_for("the LocalQueue CRD to be Established", lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []), 60)
        yield body
    finally:
        ext.delete_custom_resource_definition(body["metadata"]["name"])


def test_up_with_a_kueue_queue(kube_env, cli, custom_objects, namespace, shared_volume, kueue_crd):
    # the queue does not exist: refused before anything is created
    code, out, err = cli(*up_args(namespace, 1), "--queue", "team-a")
    assert code == 1 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: Kueue LocalQueue {namespace}/team-a does not exist") and "kubectl get localqueues" in line
    assert not rayclusters(custom_objects, namespace)

    custom_objects.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "team-a", "namespace": namespace}, "spec": {"clusterQueue": "gpus"}})
    code, out, err = cli(*up_args(namespace, 1), "--queue", "team-a", "--no-wait", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["preflight"]["queue"] == {"kind": "kueue", "queue": "team-a", "checked": True}
    [rc] = rayclusters(custom_objects, namespace)
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "suspend" not in rc["spec"]  # Kueue's to set, never miles-ray's
    pod_labels = [rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"],
                  rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]]
    assert all("kueue.x-k8s.io/queue-name" not in labels for labels in pod_labels)  # the object only
    code, _, err = cli("park", "-y", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 1 and "Kueue admits RayCluster" in err
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))


def test_up_with_a_queue_and_no_queue_crd_says_nothing_gates_it(kube_env, cli, custom_objects, namespace,
                                                                 shared_volume):
    code, out, err = cli(*up_args(namespace, 1), "--queue", "team-b", "--dry-run", "server", "-o", "json")
    assert code == 0, err
    report = json.loads(out)["preflight"]["queue"]
    assert report["checked"] is False and "localqueues.kueue.x-k8s.io is not served" in report["note"]
    assert json.loads(out)["raycluster"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-b"
