"""An OLDER KubeRay operator's CRD on the real API server: preflight refuses a rendered field it does not know.

Runs among the last e2e tests (file name): it replaces the RayCluster CRD of the shared control plane with
KubeRay v1.5.0's (tests/data/kuberay/v1.5.0, sha256-checked: no ``spec.authOptions``), shows that the API
server really DROPS that field on create (why the refusal matters: the cluster would come up without token
authentication), that ``up`` refuses it (the default render has it: asserted, never added by the test) in one line naming the version needed (exit 2, nothing created), and
restores the CRD of the operator the control plane runs (cluster/versions.env), where the same render passes
preflight and the server's dry run keeps the field."""

from __future__ import annotations

import hashlib
import re

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.test_kube_cli import IMAGE, RAY, rayclusters, up_args
from tests.infra.fixtures import fakegpu

pytestmark = pytest.mark.e2e

OLD = REPO / "tests" / "data" / "kuberay" / "v1.5.0"
CRD = "rayclusters.ray.io"


def _old_crd() -> dict:
    raw = (OLD / "ray.io_rayclusters.yaml").read_bytes()
    sums = dict(ln.split("=", 1) for ln in (OLD / "SOURCE").read_text().splitlines()
                if ln.strip() and not ln.startswith("#"))
    assert hashlib.sha256(raw).hexdigest() == sums["SHA256"]
    return yaml.safe_load(raw)


def _install(ext, body: dict, wait_for) -> None:
    current = ext.read_custom_resource_definition(CRD)
    body = {**body, "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version}}
    ext.replace_custom_resource_definition(CRD, body)
    wanted = "authOptions" in yaml.safe_dump(body["spec"]["versions"])

    def served() -> bool:
        crd = ext.read_custom_resource_definition(CRD)
        [v1] = [v for v in crd.spec.versions if v.name == "v1"]
        has = "authOptions" in (v1.schema.open_apiv3_schema.properties["spec"].properties or {})
        established = any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
        return has == wanted and established

    wait_for(f"CRD {CRD} replaced", served, timeout=60)


def _dry_run_create(custom_objects, namespace: str, name: str) -> dict:
    body = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"authOptions": {"mode": "token"},
                     "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                         {"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}}
    return custom_objects.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", body,
                                                          dry_run="All")


def test_older_operator_crd_refuses_unknown_field(kube_env, k8s_api, custom_objects, cli, namespace, shared_volume,
                                                  wait_for):
    from kubernetes import client

    # the default render has token auth (spec.authOptions): nothing here adds it, so if a change ever dropped it
    # from the default, this fails instead of the refusal below being shown on a field the test put there
    code, out, err = cli("render", "-F", "kuberay", "-o", "json", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY,
                         "--name", "miles-e2e", "--namespace", namespace)
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["authOptions"]["mode"] == "token", out

    ext = client.ApiextensionsV1Api(k8s_api)
    current = yaml.safe_load((fakegpu.artifact_paths()["crds"] / "ray.io_rayclusters.yaml").read_text())
    _install(ext, _old_crd(), wait_for)
    try:
        # the API server silently prunes what the installed CRD does not declare
        assert "authOptions" not in _dry_run_create(custom_objects, namespace, "prune-probe")["spec"]

        code, out, err = cli(*up_args(namespace, 2), "--no-wait")
        assert code == 2, err
        [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]  # (progress lines come before it)
        assert "does not know RayCluster field spec.authOptions" in line
        assert re.search(r"needs KubeRay >= v1\.(5\.1|6\.0)\b", line), line
        assert rayclusters(custom_objects, namespace) == []  # nothing created
    finally:
        _install(ext, current, wait_for)

    # the operator the control plane runs knows it: the field survives the server's dry run and preflight passes
    assert _dry_run_create(custom_objects, namespace, "prune-probe")["spec"]["authOptions"] == {"mode": "token"}
    code, out, err = cli(*up_args(namespace, 2), "--dry-run", "server", "-o", "json")
    assert code == 0, err
    assert rayclusters(custom_objects, namespace) == []
