"""Cluster lifecycle on the fake-GPU control plane (a real API server, the real KubeRay operator, kwok GPU
nodes): the autoscaler refusal of 'scale', park and resume. kwok pods run no Ray, so every wait here stops at
"pods ready and the RayCluster reports ready" (--no-ray-check, as 'up' in tests/e2e/test_kube_cli.py); that
every GPU worker rejoins Ray after 'resume' is shown on real pods (tests/realpods)."""

from __future__ import annotations

import copy
import json
import pytest

from tests.e2e.test_kube_cli import kube_args, up_args, worker_pods
from tests.e2e.test_polyaxon_up import args as px_args
from tests.e2e.test_polyaxon_up import px_env  # noqa: F401 - the fixture
from tests.infra.fixtures import ray_token_secret

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


def test_park_and_resume_kuberay(kube_env, cli, core_v1, custom_objects, namespace, shared_volume, wait_for):
    code, _, err = cli(*up_args(namespace, 2))
    assert code == 0, err
    pvcs = [c.metadata.name for c in core_v1.list_namespaced_persistent_volume_claim(namespace).items]

    code, _, err = cli("park", "--backend", "kubernetes", *kube_args(namespace))  # no terminal, no --yes
    assert code == 2 and "without confirmation" in err and worker_pods(core_v1, namespace)

    code, out, err = cli("park", "-y", "--backend", "kubernetes", "--timeout", "120", "-o", "json",
                         *kube_args(namespace))
    assert code == 0, err
    assert json.loads(out)["parked"] is True
    rc = _get(custom_objects, namespace, "miles-e2e")
    assert rc["spec"]["suspend"] is True  # the object stays, suspended
    assert not core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e").items
    assert [c.metadata.name for c in core_v1.list_namespaced_persistent_volume_claim(namespace).items] == pvcs
    wait_for("KubeRay to report the cluster suspended", lambda: any(
        c["type"] == "RayClusterSuspended" and c["status"] == "True"
        for c in _get(custom_objects, namespace, "miles-e2e").get("status", {}).get("conditions") or []), timeout=60)
    code, out, _ = cli("status", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 0 and "parked (spec.suspend: true)" in out
    code, out, err = cli("park", "-y", "--backend", "kubernetes", "-o", "json", *kube_args(namespace))
    assert code == 0 and json.loads(out)["already_parked"] is True, err

    # resume: kwok pods run no Ray, so the wait stops at pods ready + RayCluster ready (--no-ray-check, as 'up')
    code, out, err = cli("resume", "--backend", "kubernetes", "--no-ray-check", "--timeout", "120", "-o", "json",
                         *kube_args(namespace))
    assert code == 0, err
    back = json.loads(out)
    assert back["resumed"] is True and back["status"]["ready_workers"] == 2
    assert _get(custom_objects, namespace, "miles-e2e")["spec"]["suspend"] is False
    assert len(worker_pods(core_v1, namespace)) == 2
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))


def test_park_refuses_a_cluster_kueue_admits(kube_env, cli, core_v1, custom_objects, namespace, shared_volume):
    """Kueue owns spec.suspend of what it admits: park refuses (and changes nothing) rather than fight it."""
    code, _, err = cli(*up_args(namespace, 1))
    assert code == 0, err
    custom_objects.patch_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayclusters", "miles-e2e",
        {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}})
    code, out, err = cli("park", "-y", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 1 and out == ""
    [line] = err.strip().splitlines()[-1:]
    assert line.startswith("error: Kueue admits RayCluster miles-e2e (queue 'team-a')") and "'miles-ray down'" in line
    assert not _get(custom_objects, namespace, "miles-e2e")["spec"].get("suspend")
    assert len(worker_pods(core_v1, namespace)) == 1
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))


def test_park_and_resume_through_polyaxon(px_env, cli, core_v1, namespace, tmp_path):  # noqa: F811
    """The Polyaxon path against the real Polyaxon API server: park stops the run and keeps the operation it was
    created from; resume creates a new run from exactly that operation. The sandbox has no agent, so no pods are
    made here (hence --no-wait): what is shown is the run lifecycle on the server."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    ray_token_secret(core_v1, namespace, "px-park")  # what the operation's pods read RAY_AUTH_TOKEN from
    code, out, err = cli(*px_args(namespace, "px-park"))
    assert code == 0, err
    first = json.loads(out)["polyaxon_uuid"]
    api = PolyaxonApi(host=px_env.host)
    sent = api.get_run("default", "miles-e2e", first, with_conditions=False)["raw_content"]
    kube = ["--backend", "kubernetes", "--namespace", namespace, "--name", "px-park", "-c", "px.yaml"]

    code, out, err = cli("park", "-y", *kube, "-o", "json")
    assert code == 0, err
    assert json.loads(out)["stopped_uuid"] == first
    assert api.wait_for_status("default", "miles-e2e", first, {"stopping", "stopped"}, timeout=30)["status"] in {
        "stopping", "stopped"}
    code, out, _ = cli("status", *kube, "-o", "json")
    assert code == 0 and json.loads(out)["parked"] is True and json.loads(out)["stopped_uuid"] == first

    code, out, err = cli("resume", *kube, "--no-wait", "-o", "json")
    assert code == 0, err
    back = json.loads(out)
    assert back["resumed"] is True and back["resumed_from"] == first and back["polyaxon_uuid"] != first
    assert back["raycluster"] == f"plx-operation-{back['polyaxon_uuid']}"
    assert api.get_run("default", "miles-e2e", back["polyaxon_uuid"], with_conditions=False)["raw_content"] == sent
    code, out, err = cli("resume", *kube, "--no-wait", "-o", "json")  # not parked any more: nothing created
    assert code == 0 and json.loads(out)["resumed"] is False, err
    api.stop_run("default", "miles-e2e", back["polyaxon_uuid"])
