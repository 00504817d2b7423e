"""Exposure, least privilege and pod security on the real apiserver (RBAC and PodSecurity admission on)
with the real KubeRay operator.

- The Ray dashboard / Jobs API is never exposed outside the cluster: ClusterIP in every rendered document
  and on the Service the operator creates; no NodePort, LoadBalancer or Ingress.
- manifests/rbac.yaml is enough: a ServiceAccount token from the TokenRequest API runs up, status, scale,
  down; a namespace where the Role is not bound gives one clear 'forbidden:' line.
- The pods KubeRay creates from our RayCluster are admitted under the 'baseline' Pod Security Standard.
- down never deletes storage (the PVC survives).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import IMAGE
from tests.reliability.conftest import REPO, one_error_line

RAY = "2.60.0"


def test_rendered_documents_never_expose_the_dashboard(cli, clean_env):
    code, _, err = cli("render", "-F", "all", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY, "--out", "out")
    assert code == 0, err
    files = sorted((clean_env / "out").iterdir())
    assert files
    for f in files:
        text = f.read_text()
        for word in ("LoadBalancer", "NodePort", "Ingress", "hostNetwork", "hostPort", "externalIPs"):
            assert word not in text, (f.name, word)
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "RayCluster":
                assert doc["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
    # the same for every committed example
    for f in (REPO / "manifests").glob("*.yaml"):
        assert "LoadBalancer" not in f.read_text() and "NodePort" not in f.read_text(), f.name


def _apply_rbac(k8s_api, namespace: str, cluster_role: str) -> None:
    from kubernetes import utils
    from kubernetes.client.rest import ApiException

    text = (REPO / "manifests" / "rbac.yaml").read_text().replace("NAMESPACE", namespace)
    text = text.replace("name: miles-ray-preflight\n", f"name: {cluster_role}\n")
    for doc in yaml.safe_load_all(text):
        try:
            utils.create_from_dict(k8s_api, doc)
        except utils.FailToCreateError as e:
            if not all(isinstance(x, ApiException) and x.status == 409 for x in e.api_exceptions):
                raise
        except ApiException as e:
            if e.status != 409:
                raise


def _sa_kubeconfig(core_v1, fake_k8s, namespace: str, path: Path) -> Path:
    from kubernetes import client

    tr = core_v1.create_namespaced_service_account_token("miles-ray", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)))
    admin = yaml.safe_load(Path(fake_k8s.kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    if not ca:
        ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "miles-ray",
           "clusters": [{"name": "fake", "cluster": {"server": cluster["server"], "certificate-authority-data": ca}}],
           "users": [{"name": "miles-ray", "user": {"token": tr.status.token}}],
           "contexts": [{"name": "miles-ray", "context": {"cluster": "fake", "user": "miles-ray",
                                                          "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


@pytest.mark.e2e
def test_least_privilege_identity_runs_everything_and_pods_meet_baseline(
        kube_env, k8s_api, core_v1, custom_objects, namespace, shared_volume, cli, tmp_path, wait_for, ledger):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ledger.record("security", "least-privilege identity + baseline PSS")
    # Pod Security: enforce 'baseline' here (PodSecurity admission is on by default in the apiserver)
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    # enforcement is really on: a privileged pod is refused. The admission plugin reads namespace labels from
    # an informer cache, so the label can take a moment to apply: retry (deleting any pod admitted meanwhile).
    def privileged_refused():
        try:
            core_v1.create_namespaced_pod(namespace, client.V1Pod(
                metadata=client.V1ObjectMeta(name="priv"),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="c", image="x", security_context=client.V1SecurityContext(privileged=True))])))
        except ApiException as e:
            return e
        core_v1.delete_namespaced_pod("priv", namespace, grace_period_seconds=0)
        wait_for("admitted privileged pod deleted", lambda: not [
            p for p in core_v1.list_namespaced_pod(namespace).items if p.metadata.name == "priv"], timeout=30)
        return None

    refused = wait_for("PodSecurity 'baseline' enforced", privileged_refused, timeout=30)
    assert refused.status == 403 and "PodSecurity" in refused.body

    cluster_role = f"miles-ray-preflight-{namespace}"
    _apply_rbac(k8s_api, namespace, cluster_role)
    kubeconfig = _sa_kubeconfig(core_v1, kube_env, namespace, tmp_path / "sa.kubeconfig")
    common = ["--namespace", namespace, "--name", "lp", "--kubeconfig", str(kubeconfig)]
    try:
        code, out, err = cli("up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY,
                             "--no-ray-check", "--timeout", "120", *common)
        assert code == 0, err
        # the operator's pods were admitted under 'baseline'
        pods = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=lp").items
        assert sorted(p.metadata.labels["ray.io/node-type"] for p in pods) == ["head", "worker", "worker"]
        # exposure: the Service the real operator made is ClusterIP; nothing else publishes it
        svcs = core_v1.list_namespaced_service(namespace).items
        assert svcs and all(s.spec.type == "ClusterIP" for s in svcs), [(s.metadata.name, s.spec.type) for s in svcs]
        assert "lp-head-svc" in {s.metadata.name for s in svcs}
        assert not any(s.spec.external_ips for s in svcs)
        assert client.NetworkingV1Api(k8s_api).list_namespaced_ingress(namespace).items == []

        # pods/portforward is authorized for this identity (kwok runs no kubelet, so the stream itself cannot
        # carry data here: what matters is that the API server does not answer 403)
        from kubernetes import config as kconfig
        from kubernetes.stream import portforward

        sa_core = client.CoreV1Api(kconfig.new_client_from_config(config_file=str(kubeconfig)))
        head = next(p.metadata.name for p in pods if p.metadata.labels["ray.io/node-type"] == "head")
        try:
            pf = portforward(sa_core.connect_get_namespaced_pod_portforward, head, namespace, ports="8265")
            pf.close()
        except Exception as e:  # noqa: BLE001 - anything but an authorization failure
            assert "403" not in str(e) and "forbidden" not in str(e).lower(), e
        code, out, err = cli("status", "--backend", "kubernetes", "-o", "json", *common)
        assert code == 0, err
        assert json.loads(out)["ready_workers"] == 2
        # the Ray token (authOptions, the default): the identity reads the one Secret KubeRay made for the
        # RayCluster -- 'get' only; listing Secrets stays refused (below)
        token = wait_for("the Ray token Secret lp", lambda: _readable_secret(sa_core, namespace, "lp"), timeout=60)
        assert token.data and token.data.get("auth_token")
        code, out, err = cli("scale", "--nodes", "3", "--no-ray-check", "--timeout", "120", "--backend", "kubernetes",
                             *common)
        assert code == 0, err
        code, out, err = cli("down", "-y", "--backend", "kubernetes", *common)
        assert code == 0, err
        wait_for("RayCluster gone", lambda: not custom_objects.list_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayclusters")["items"], timeout=60)
        # storage survives down
        assert core_v1.read_namespaced_persistent_volume_claim("miles-data", namespace).status.phase == "Bound"

        # one forbidden action: a namespace where the Role is not bound
        other = f"e2e-{uuid.uuid4().hex[:8]}"
        core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
        try:
            code, out, err = cli("up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY,
                                 "--no-ray-check", "--timeout", "60", "--namespace", other, "--name", "lp",
                                 "--kubeconfig", str(kubeconfig))
            assert code == 1 and one_error_line(err), err
            line = next(ln for ln in err.splitlines() if ln.startswith("error:"))
            assert line.startswith("error: forbidden: ") and "rbac.yaml" in line, line
            assert custom_objects.list_namespaced_custom_object("ray.io", "v1", other, "rayclusters")["items"] == []
        finally:
            core_v1.delete_namespace(other)
        # and what the identity cannot do at all: delete storage, list (enumerate) secrets
        sa_api = __import__("kubernetes").config.new_client_from_config(config_file=str(kubeconfig))
        for call in (lambda: client.CoreV1Api(sa_api).delete_namespaced_persistent_volume_claim("miles-data", namespace),
                     lambda: client.CoreV1Api(sa_api).list_namespaced_secret(namespace)):
            with pytest.raises(ApiException) as no:
                call()
            assert no.value.status == 403
    finally:
        try:
            client.RbacAuthorizationV1Api(k8s_api).delete_cluster_role_binding(f"miles-ray-preflight-{namespace}")
        except ApiException:
            pass
        try:
            client.RbacAuthorizationV1Api(k8s_api).delete_cluster_role(cluster_role)
        except ApiException:
            pass


def _readable_secret(core, namespace: str, name: str):
    """The Secret read with ``core``'s identity, None while it does not exist yet (403 fails the test)."""
    from kubernetes.client.rest import ApiException

    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
