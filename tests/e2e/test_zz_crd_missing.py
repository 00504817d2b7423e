"""Preflight when the KubeRay CRD is missing. Runs last among the e2e tests (file name): it deletes the
RayCluster CRD from the shared control plane, checks the refusal, restores the CRD from the same KubeRay
module and proves the operator reconciles RayClusters again."""

from __future__ import annotations


import pytest
import yaml

from tests.infra.fixtures import fakegpu
from tests.e2e.test_kube_cli import rayclusters, up_args

pytestmark = pytest.mark.e2e


def test_missing_crd_is_refused_before_anything_is_created(fake_k8s, k8s_api, cli, namespace, monkeypatch, tmp_path,
                                                            wait_for):
    from kubernetes import client

    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    ext = client.ApiextensionsV1Api(k8s_api)
    crd_file = fakegpu.artifact_paths()["crds"] / "ray.io_rayclusters.yaml"
    body = yaml.safe_load(crd_file.read_text())
    ext.delete_custom_resource_definition("rayclusters.ray.io")
    try:
        wait_for("CRD gone", lambda: "rayclusters.ray.io" not in
                 [c.metadata.name for c in ext.list_custom_resource_definition().items], timeout=60)
        code, _, err = cli(*up_args(namespace, 2))
        assert code == 1
        assert "RayCluster CRD (rayclusters.ray.io) is not installed" in err and "Helm chart" in err
    finally:
        ext.create_custom_resource_definition(body)

        def established() -> bool:
            crd = ext.read_custom_resource_definition("rayclusters.ray.io")
            return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

        wait_for("CRD Established again", established, timeout=60)
    # the operator picks RayClusters up again after the CRD comes back
    from kubernetes import client as kc

    core = kc.CoreV1Api(k8s_api)
    core.create_namespaced_persistent_volume_claim(namespace, kc.V1PersistentVolumeClaim(
        metadata=kc.V1ObjectMeta(name="miles-data"),
        spec=kc.V1PersistentVolumeClaimSpec(access_modes=["ReadWriteMany"], storage_class_name="manual-none",
                                            resources=kc.V1VolumeResourceRequirements(requests={"storage": "1Gi"}))))
    code, _, err = cli(*up_args(namespace, 1), "--no-wait")
    assert code == 0, err
    wait_for("operator creates the head pod again",
             lambda: core.list_namespaced_pod(namespace, label_selector="ray.io/cluster=miles-e2e").items, timeout=90)
    assert len(rayclusters(kc.CustomObjectsApi(k8s_api), namespace)) == 1
