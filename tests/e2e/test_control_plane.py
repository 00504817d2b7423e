"""The fake-GPU control plane behaves like a real cluster for KubeRay.

Real kube-apiserver + scheduler + controller-manager + KubeRay operator; kwok stands in for the
kubelets of the fake nodes. Nothing here is mocked.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
RAY_IMAGE = "rayproject/ray:2.60.0"  # never pulled: kwok runs no containers


def raycluster(name: str, workers: int, gpus_per_worker: int) -> dict[str, Any]:
    worker_resources = {"cpu": "4", "memory": "16Gi", GPU: str(gpus_per_worker)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": "0"},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": RAY_IMAGE,
                                "resources": {
                                    "requests": {"cpu": "1", "memory": "2Gi"},
                                    "limits": {"cpu": "1", "memory": "2Gi"},
                                },
                            }
                        ]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": workers,
                    "minReplicas": workers,
                    "maxReplicas": workers,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                            "containers": [
                                {
                                    "name": "ray-worker",
                                    "image": RAY_IMAGE,
                                    "resources": {"requests": worker_resources, "limits": worker_resources},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def pods_of(core_v1: Any, ns: str, cluster: str, node_type: str | None = None) -> list[Any]:
    selector = f"ray.io/cluster={cluster}"
    if node_type:
        selector += f",ray.io/node-type={node_type}"
    return core_v1.list_namespaced_pod(ns, label_selector=selector).items


def running_and_ready(pod: Any) -> bool:
    if pod.status.phase != "Running" or pod.metadata.deletion_timestamp:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def get_rc(custom_objects: Any, ns: str, name: str) -> dict[str, Any]:
    return custom_objects.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def create_rc(custom_objects: Any, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return custom_objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def delete_rc(custom_objects: Any, ns: str, name: str) -> None:
    try:
        custom_objects.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except ApiException as e:
        if e.status != 404:
            raise


# --------------------------------------------------------------------------------------------


def test_gpu_nodes_advertise_gpus(fake_k8s: Any, core_v1: Any) -> None:
    nodes = {n.metadata.name: n for n in core_v1.list_node().items}
    assert set(nodes) == set(fake_k8s.nodes)  # exactly the nodes the control plane was started with
    gpu_labelled = {name for name, n in nodes.items()
                    if (n.metadata.labels or {}).get("nvidia.com/gpu.present") == "true"}
    assert gpu_labelled == set(fake_k8s.gpu_nodes)
    assert len(fake_k8s.gpu_nodes) >= 2, "the tests below need two GPU nodes for two 8-GPU workers"
    for name in fake_k8s.gpu_nodes:
        node = nodes[name]
        assert node.status.capacity[GPU] == "8"
        assert node.status.allocatable[GPU] == "8"
        assert node.status.allocatable["cpu"] == "96"
        assert node.status.allocatable["memory"] == "1Ti"
        assert node.status.allocatable["pods"] == "110"
        assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
        assert [(t.key, t.effect) for t in node.spec.taints or []] == [(GPU, "NoSchedule")]
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", f"{name} not Ready: {node.status.conditions}"
    for name in fake_k8s.cpu_nodes:
        node = nodes[name]
        assert GPU not in (node.status.allocatable or {})
        assert not node.spec.taints
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_raycluster_gpu_workers_land_on_distinct_gpu_nodes(
    fake_k8s: Any, core_v1: Any, custom_objects: Any, namespace: str, wait_for: Any
) -> None:
    name = "rc-gpu"
    create_rc(custom_objects, namespace, raycluster(name, workers=2, gpus_per_worker=8))

    # The real KubeRay operator turns the RayCluster into pods ...
    wait_for(
        "KubeRay to create 1 head + 2 worker pods",
        lambda: len(pods_of(core_v1, namespace, name, "head")) == 1
        and len(pods_of(core_v1, namespace, name, "worker")) == 2,
        timeout=60,
    )
    # ... the scheduler binds them and kwok runs them.
    pods = wait_for(
        "all pods Running and Ready",
        lambda: (p := pods_of(core_v1, namespace, name)) and len(p) == 3 and all(map(running_and_ready, p)) and p,
        timeout=90,
    )
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    head = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "head"][0]

    worker_nodes = [p.spec.node_name for p in workers]
    assert len(set(worker_nodes)) == 2, f"8-GPU workers must not share a node: {worker_nodes}"
    assert set(worker_nodes) <= set(fake_k8s.gpu_nodes)
    for p in workers:
        assert p.spec.containers[0].resources.limits[GPU] == "8"
    # The head does not tolerate the GPU taint: it lands on the CPU node.
    assert head.spec.node_name in fake_k8s.cpu_nodes

    rc = wait_for(
        "RayCluster status.readyWorkerReplicas == 2",
        lambda: (r := get_rc(custom_objects, namespace, name)).get("status", {}).get("readyWorkerReplicas") == 2
        and r,
        timeout=90,
    )
    status = rc["status"]
    assert status.get("desiredWorkerReplicas") == 2
    assert str(status.get("desiredGPU")) == "16"
    assert status.get("head", {}).get("podIP") == head.status.pod_ip
    delete_rc(custom_objects, namespace, name)


def test_worker_asking_for_nine_gpus_stays_pending(
    fake_k8s: Any, core_v1: Any, custom_objects: Any, namespace: str, wait_for: Any
) -> None:
    name = "rc-too-big"
    create_rc(custom_objects, namespace, raycluster(name, workers=1, gpus_per_worker=9))

    def unschedulable_condition() -> Any:
        workers = pods_of(core_v1, namespace, name, "worker")
        if len(workers) != 1:
            return None
        for c in workers[0].status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return workers[0], c
        return None

    worker, cond = wait_for("the 9-GPU worker to be reported Unschedulable", unschedulable_condition, timeout=90)
    assert GPU in cond.message, cond.message
    assert worker.status.phase == "Pending"
    assert not worker.spec.node_name
    # The head is fine.
    wait_for(
        "head Running",
        lambda: (h := pods_of(core_v1, namespace, name, "head")) and running_and_ready(h[0]),
        timeout=90,
    )
    rc = get_rc(custom_objects, namespace, name)
    assert rc.get("status", {}).get("readyWorkerReplicas", 0) == 0
    # Still pending a little later: nothing can ever fit 9 GPUs on an 8-GPU node.
    worker = core_v1.read_namespaced_pod(worker.metadata.name, namespace)
    assert worker.status.phase == "Pending" and not worker.spec.node_name
    delete_rc(custom_objects, namespace, name)


def test_deleting_raycluster_garbage_collects_pods(
    fake_k8s: Any, core_v1: Any, custom_objects: Any, namespace: str, wait_for: Any
) -> None:
    name = "rc-gc"
    rc = create_rc(custom_objects, namespace, raycluster(name, workers=1, gpus_per_worker=8))
    pods = wait_for(
        "pods Running",
        lambda: (p := pods_of(core_v1, namespace, name)) and len(p) == 2 and all(map(running_and_ready, p)) and p,
        timeout=90,
    )
    for p in pods:
        owners = [(o.kind, o.name, o.uid) for o in p.metadata.owner_references or []]
        assert ("RayCluster", name, rc["metadata"]["uid"]) in owners
    services = core_v1.list_namespaced_service(namespace, label_selector=f"ray.io/cluster={name}").items
    assert services, "KubeRay creates the head Service"

    delete_rc(custom_objects, namespace, name)
    # The controller-manager's garbage collector deletes the dependents; kwok completes pod deletion.
    wait_for("pods garbage-collected", lambda: not pods_of(core_v1, namespace, name), timeout=90)
    wait_for(
        "head Service garbage-collected",
        lambda: not core_v1.list_namespaced_service(namespace, label_selector=f"ray.io/cluster={name}").items,
        timeout=60,
    )


def test_rbac_is_enforced_for_service_accounts(
    fake_k8s: Any, core_v1: Any, custom_objects: Any, namespace: str, k8s_api: Any, wait_for: Any
) -> None:
    """Authorization is Node,RBAC: a ServiceAccount may create RayClusters only once a Role allows it."""
    from kubernetes import client

    core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": "launcher"}})
    token = core_v1.create_namespaced_service_account_token(
        "launcher", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    cfg = client.Configuration()
    cfg.host = k8s_api.configuration.host
    cfg.ssl_ca_cert = k8s_api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    as_launcher = client.CustomObjectsApi(client.ApiClient(cfg))
    body = raycluster("rc-rbac", workers=0, gpus_per_worker=8)

    with pytest.raises(ApiException) as denied:
        as_launcher.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:launcher" in denied.value.body

    rbac = client.RbacAuthorizationV1Api(k8s_api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "raycluster-editor"},
            "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "delete"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "launcher-raycluster-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "raycluster-editor"},
            "subjects": [{"kind": "ServiceAccount", "name": "launcher", "namespace": namespace}],
        },
    )
    # The authorizer sees the new binding through its informer cache: wait until it answers "allowed".
    review = {"spec": {"resourceAttributes": {"group": GROUP, "resource": PLURAL, "verb": "create",
                                              "namespace": namespace}}}
    auth = client.AuthorizationV1Api(client.ApiClient(cfg))
    wait_for("the launcher's RayCluster create to be authorized",
             lambda: auth.create_self_subject_access_review(review).status.allowed, timeout=30)
    created = as_launcher.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert created["metadata"]["name"] == "rc-rbac"
    # Still no access to anything else.
    with pytest.raises(ApiException) as denied_pods:
        client.CoreV1Api(client.ApiClient(cfg)).list_namespaced_pod(namespace)
    assert denied_pods.value.status == 403
    delete_rc(custom_objects, namespace, "rc-rbac")
