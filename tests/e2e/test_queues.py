"""Queues on the real API server with the real KubeRay operator and a REAL Kueue controller: 'up --queue'.

What is real: Kueue's controller manager built from its Go module (sigs.k8s.io/kueue, version pinned in
cluster/versions.env, built and cached by 'cluster/build.sh kueue'), started beside the session's control plane
for this module only (the ``kueue`` fixture, cluster/kueue.py) with its RayCluster integration, its CRDs from the
same module zip, and its admission webhooks registered with the API server (by URL on 127.0.0.1). So Kueue's
webhook suspends every RayCluster that names a LocalQueue, Kueue makes a Workload for it (head + workers, one
gang), admits it when the whole gang fits its ClusterQueue's quota and unsuspends it, and only then does KubeRay
create pods (on kwok's fake GPU nodes). What miles-ray does is checked against that: the queue label on the
object only, the LocalQueue checked before anything is created, 'up' saying that it waits for Kueue (with Kueue's
reason) and timing out with a clear line, 'status' showing the cluster queued, 'park' leaving suspend to Kueue,
'scale' refusing a new size without --force (to Kueue it is a new Workload: the whole cluster restarts).
Nothing here is faked; Kueue runs for this module only and is stopped by PID, its webhooks and CRDs removed.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from tests.e2e.test_kube_cli import IMAGE, RAY, kube_args, rayclusters, worker_pods

pytestmark = pytest.mark.e2e

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUOTA_GPUS = 4


def queued_up(namespace: str, name: str, nodes: int, queue: str, timeout: int = 120) -> list[str]:
    return ["up", "--via", "kuberay", "--nodes", str(nodes), "-G", "2", "--image", IMAGE, "--ray-version", RAY,
            "--no-ray-check", "--timeout", str(timeout), "--queue", queue, *kube_args(namespace, name)]


def pods_of(core_v1, namespace: str, name: str) -> list[Any]:
    return core_v1.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={name}").items


def workload_of(custom_objects, namespace: str, rc: dict) -> dict | None:
    items = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
    return next((w for w in items if any(r["uid"] == rc["metadata"]["uid"]
                                         for r in w["metadata"].get("ownerReferences") or [])), None)


def condition(obj: dict | None, kind: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


@pytest.fixture
def gpu_queue(kueue, custom_objects, namespace) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with QUOTA_GPUS nvidia.com/gpu for this test's namespace only, and the
    LocalQueue ``team-a`` pointing at it; deleted afterwards."""
    rf, cq = f"rf-{namespace}", f"cq-{namespace}"
    custom_objects.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": rf}})
    custom_objects.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                     {"name": rf, "resources": [{"name": "cpu", "nominalQuota": "1000"},
                                                {"name": "memory", "nominalQuota": "100Ti"},
                                                {"name": "nvidia.com/gpu", "nominalQuota": QUOTA_GPUS}]}]}]}})
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
        "metadata": {"name": "team-a", "namespace": namespace}, "spec": {"clusterQueue": cq}})
    yield "team-a"
    # Kueue lifts its finalizers once the namespace's RayClusters (and so their Workloads) are gone.
    custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", "team-a")
    custom_objects.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq)
    custom_objects.delete_cluster_custom_object(GROUP, VERSION, "resourceflavors", rf)


# First: no Kueue CRD is served before the module's ``kueue`` fixture starts Kueue (it stops at module end).
def test_up_with_a_queue_and_no_queue_crd_says_nothing_gates_it(kube_env, cli, custom_objects, namespace,
                                                                 shared_volume):
    code, out, err = cli("up", "--via", "kuberay", "--nodes", "1", "--image", IMAGE, "--ray-version", RAY,
                         "--queue", "team-b", "--dry-run", "server", "-o", "json", *kube_args(namespace))
    assert code == 0, err
    report = json.loads(out)["preflight"]["queue"]
    assert report["checked"] is False and "localqueues.kueue.x-k8s.io is not served" in report["note"]
    assert json.loads(out)["raycluster"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-b"


def test_up_checks_the_localqueue_and_leaves_suspend_to_kueue(kube_env, cli, core_v1, custom_objects, namespace,
                                                              shared_volume, gpu_queue):
    # the queue does not exist: refused before anything is created
    code, out, err = cli(*queued_up(namespace, "miles-e2e", 1, "team-z"))
    assert code == 1 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: Kueue LocalQueue {namespace}/team-z does not exist") and "kubectl get localqueues" in line
    assert not rayclusters(custom_objects, namespace)

    # what miles-ray sends: the label on the object, never spec.suspend, nothing on the pods
    code, out, err = cli(*queued_up(namespace, "miles-e2e", 1, gpu_queue), "--dry-run", "client", "-o", "json")
    assert code == 0, err
    sent = json.loads(out)["raycluster"]
    assert sent["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == gpu_queue and "suspend" not in sent["spec"]
    assert all("kueue.x-k8s.io/queue-name" not in (g["template"]["metadata"].get("labels") or {})
               for g in [sent["spec"]["headGroupSpec"], *sent["spec"]["workerGroupSpecs"]])
    assert not rayclusters(custom_objects, namespace)  # a client dry run creates nothing

    code, out, err = cli(*queued_up(namespace, "miles-e2e", 1, gpu_queue), "--no-wait", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["preflight"]["queue"] == {"kind": "kueue", "queue": gpu_queue, "checked": True}
    [rc] = rayclusters(custom_objects, namespace)
    assert rc["spec"]["suspend"] is True  # set by Kueue's webhook at creation, until Kueue admits it
    code, _, err = cli("park", "-y", "--backend", "kubernetes", *kube_args(namespace))
    assert code == 1 and "Kueue admits RayCluster" in err
    cli("down", "-y", "--backend", "kubernetes", *kube_args(namespace))


def test_kueue_admits_a_gang_that_fits_and_holds_back_one_that_does_not(kube_env, cli, core_v1, custom_objects,
                                                                       namespace, shared_volume, gpu_queue,
                                                                       wait_for):
    # 2 workers x 2 GPUs = the whole quota: admitted as one gang, unsuspended, pods created, up returns
    code, out, err = cli(*queued_up(namespace, "gang-a", 2, gpu_queue), "-o", "json")
    assert code == 0, err
    assert "waiting for Kueue to admit RayCluster" in err  # it was queued (suspended) before Kueue admitted it
    [rc_a] = rayclusters(custom_objects, namespace)
    assert rc_a["spec"]["suspend"] is False
    assert condition(workload_of(custom_objects, namespace, rc_a), "Admitted")["status"] == "True"
    assert len(worker_pods(core_v1, namespace, "gang-a")) == 2
    assert json.loads(out)["status"]["ready_workers"] == 2

    # 1 more worker x 2 GPUs does not fit: suspended, its Workload pending, NO pod at all; up says so and times out
    code, out, err = cli(*queued_up(namespace, "gang-b", 1, gpu_queue, timeout=12))
    assert code == 1 and out == ""
    waiting = [line for line in err.splitlines() if f"waiting for Kueue to admit RayCluster {namespace}/gang-b" in line]
    # progress while it waits: the queue, then Kueue's own reason once Kueue has tried to admit it
    assert "LocalQueue team-a" in waiting[0] and "insufficient unused quota for nvidia.com/gpu" in waiting[-1]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: timed out after 12s: waiting for Kueue to admit RayCluster {namespace}/gang-b")
    assert "'miles-ray down' removes it" in last
    rc_b = next(rc for rc in rayclusters(custom_objects, namespace) if rc["metadata"]["name"] == "gang-b")
    assert rc_b["spec"]["suspend"] is True and not pods_of(core_v1, namespace, "gang-b")
    wl_b = workload_of(custom_objects, namespace, rc_b)
    assert condition(wl_b, "QuotaReserved").get("status") != "True"

    code, out, err = cli("status", "-o", "json", "--backend", "kubernetes", *kube_args(namespace, "gang-b"))
    assert code == 0, err
    queue = json.loads(out)["queue"]
    assert queue["queued"] is True and "insufficient unused quota" in queue["reason"]
    code, out, err = cli("status", "--backend", "kubernetes", *kube_args(namespace, "gang-b"))
    assert code == 0 and "queued: Kueue has not admitted it yet (LocalQueue team-a)" in out and "parked" not in out

    # Kueue, not miles-ray, owns suspend of an admitted cluster
    code, _, err = cli("park", "-y", "--backend", "kubernetes", *kube_args(namespace, "gang-a"))
    assert code == 1 and "Kueue admits RayCluster gang-a" in err

    # to Kueue a new size is a new Workload (it restarts every pod, the head too): refused without --force
    [head] = [p.metadata.name for p in pods_of(core_v1, namespace, "gang-a") if "head" in p.metadata.name]
    scale = ["scale", "-N", "1", "--no-ray-check", "--timeout", "60", "--backend", "kubernetes",
             *kube_args(namespace, "gang-a")]
    code, _, err = cli(*scale)
    assert code == 1 and "Kueue admits RayCluster gang-a" in err and "--force" in err.strip().splitlines()[-1]
    assert len(worker_pods(core_v1, namespace, "gang-a")) == 2
    code, _, err = cli(*scale, "--force")
    assert code == 0, err
    assert "waiting for Kueue to replace the Workload of gang-a by one of 1 worker(s)" in err
    # the split printed for the new size is for the cluster's own workers (2 GPUs), not the default 8
    [split] = [ln for ln in err.splitlines() if ln.startswith("split for 1 node(s)")]
    assert "--actor-num-gpus-per-node 2 --num-gpus-per-node 2" in split, split
    after = [p.metadata.name for p in pods_of(core_v1, namespace, "gang-a") if p.metadata.deletion_timestamp is None]
    assert head not in after and len(worker_pods(core_v1, namespace, "gang-a")) == 1  # a new head: Ray restarted

    # the freed quota (2 of 4 GPUs) admits the queued gang: Kueue unsuspends it and KubeRay creates its pods
    wait_for("Kueue to admit gang-b once gang-a is smaller",
             lambda: len(worker_pods(core_v1, namespace, "gang-b")) == 1, 90)
    assert not next(rc for rc in rayclusters(custom_objects, namespace)
                    if rc["metadata"]["name"] == "gang-b")["spec"]["suspend"]
