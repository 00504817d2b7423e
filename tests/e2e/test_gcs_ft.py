"""GCS fault tolerance (``--gcs-ft``) against the real kube-apiserver and the real KubeRay operator (kwok nodes: no
container runs, so whether a Redis answers is the real-pod tier's, tests/realpods/test_supervised_runs.py):

* the RayCluster ``render -F kuberay --gcs-ft ...`` prints is stored by the API server as rendered (nothing pruned)
  and KubeRay reconciles it as GCS fault tolerant (its Redis cleanup finalizer, the head's ``ray.io/ft-enabled``
  annotation and ``RAY_REDIS_ADDRESS``, the password by reference); ``down`` lets KubeRay's Redis cleanup Job run
  once to completion before the RayCluster goes (kwok completes a Job's pod);
* ``up --dry-run server`` runs the preflight (the installed CRD knows the field; the Secret is there) and the API
  server's dry run of the create, without a probe pod;
* ``up`` naming a password Secret that does not exist: one line, exit 2, nothing created (no RayCluster, no pod).
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import IMAGE

pytestmark = pytest.mark.e2e

RAY = "2.60.0"
REDIS = "redis://redis.infra.svc.cluster.local:6379"


def _flags(namespace: str, name: str, secret: str) -> list[str]:
    return ["--nodes", "1", "--image", IMAGE, "--ray-version", RAY, "--namespace", namespace, "--name", name,
            "--gcs-ft", REDIS, "--gcs-ft-password-secret", secret]


def _secret(core_v1, namespace: str, name: str) -> None:
    from kubernetes import client

    core_v1.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=name),
                                                                string_data={"password": "e2e-only"}))


def test_kuberay_accepts_and_reconciles_the_rendered_gcs_ft(kube_env, cli, core_v1, custom_objects, namespace,
                                                            shared_volume, wait_for):
    _secret(core_v1, namespace, "redis-auth")
    code, out, err = cli("render", "-F", "kuberay", *_flags(namespace, "ft-render", "redis-auth"))
    assert code == 0, err
    rendered = yaml.safe_load(out)
    created = custom_objects.create_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", rendered)
    try:
        assert created["spec"]["gcsFaultToleranceOptions"] == rendered["spec"]["gcsFaultToleranceOptions"] == {
            "redisAddress": "redis.infra.svc.cluster.local:6379",
            "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "password"}}}}

        def reconciled():
            rc = custom_objects.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "ft-render")
            return "ray.io/gcs-ft-redis-cleanup-finalizer" in (rc["metadata"].get("finalizers") or []) and rc

        wait_for("KubeRay to add its Redis cleanup finalizer", reconciled, 60)
        head = wait_for("KubeRay to create the head pod", lambda: core_v1.list_namespaced_pod(
            namespace, label_selector="ray.io/cluster=ft-render,ray.io/node-type=head").items, 60)[0]
        assert head.metadata.annotations.get("ray.io/ft-enabled") == "true"
        env = {e.name: e for e in head.spec.containers[0].env}
        assert env["RAY_REDIS_ADDRESS"].value == "redis.infra.svc.cluster.local:6379"
        assert "e2e-only" not in json.dumps(core_v1.api_client.sanitize_for_serialization(head.spec))

        # down: KubeRay's finalizer deletes the pods, then runs its Redis cleanup Job (kwok completes a Job's pod),
        # then lets the RayCluster go. down deletes such a cluster in the background: a foreground deletion has the
        # garbage collector delete that Job again and again until KubeRay gives up (300 s, Redis not emptied)
        code, out, err = cli("down", "-y", "--backend", "kubernetes", "--namespace", namespace, "--name",
                             "ft-render", "-o", "json")
        assert code == 0, err
        res = json.loads(out)
        assert res["deleted"] is True and not res.get("pods_remaining"), res
        assert not custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]
        events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.name=ft-render").items
        reasons = [e.reason for e in events]
        assert "CreatedRedisCleanupJob" in reasons, reasons
        created = [e for e in events if e.reason == "CreatedRedisCleanupJob"]
        # one cleanup Job, run to completion (not deleted by the garbage collector and created again)
        assert sum(e.count or 1 for e in created) == 1, [(e.message, e.count) for e in created]
    finally:
        if custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]:
            custom_objects.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "ft-render")
            custom_objects.patch_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", "ft-render",
                                                          {"metadata": {"finalizers": None}})


def test_up_server_dry_run_with_gcs_ft(kube_env, cli, core_v1, custom_objects, namespace, shared_volume):
    _secret(core_v1, namespace, "redis-auth")
    code, out, err = cli("up", "--via", "kuberay", "--dry-run", "server", "-o", "json",
                         *_flags(namespace, "ft-dry", "redis-auth"))
    assert code == 0, err
    res = json.loads(out)
    assert res["created"] is False and res["preflight"]["gcs_ft"].startswith(f"{REDIS}: password Secret checked")
    assert res["raycluster"]["spec"]["gcsFaultToleranceOptions"]["redisAddress"].endswith(":6379")
    assert not custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]
    assert not core_v1.list_namespaced_pod(namespace).items  # no probe pod in a dry run


def test_up_with_a_missing_password_secret_creates_nothing(kube_env, cli, core_v1, custom_objects, namespace,
                                                           shared_volume):
    code, out, err = cli("up", "--via", "kuberay", "--no-ray-check", "--timeout", "60",
                         *_flags(namespace, "ft-nosecret", "absent:pw"))
    assert code == 2, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert f"Redis password Secret {namespace}/absent does not exist" in line and "nothing was created" in line
    assert "kubectl -n" in line and "Traceback" not in err
    assert not custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]
    assert not core_v1.list_namespaced_pod(namespace).items
    # a Secret without the key is refused the same way
    _secret(core_v1, namespace, "absent")
    code, out, err = cli("up", "--via", "kuberay", "--no-ray-check", "--timeout", "60",
                         *_flags(namespace, "ft-nosecret", "absent:pw"))
    assert code == 2 and "has no key 'pw'" in err, err
    assert not custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]
