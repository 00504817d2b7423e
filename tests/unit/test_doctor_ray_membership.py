"""doctor's ray_membership: the RayCluster's Ready pods against Ray's ALIVE nodes, by IP (hand-worked cases; the
real pods and a real head are in tests/realpods)."""

from __future__ import annotations

from miles_ray.services.doctor.kube_checks import check_ray_membership


def pod(name, role, ip, ready=True, deleting=False):
    return {"name": name, "role": role, "ip": ip, "ready": ready, "deleting": deleting}


def node(ip, gpus=0.0):
    return {"ip": ip, "gpus": gpus}


HEAD = pod("rc-head-x", "head", "10.0.0.1")
W1 = pod("rc-gpu-w-a", "worker", "10.0.0.2")
W2 = pod("rc-gpu-w-b", "worker", "10.0.0.3")


def test_every_ready_pod_alive_is_ok_and_names_each_pod():
    f = check_ray_membership([HEAD, W1, W2], {"nodes": [node("10.0.0.1"), node("10.0.0.2", 8), node("10.0.0.3", 8)]})
    assert f.check == "ray_membership" and f.status == "ok"
    assert f.summary == "every Ready pod is ALIVE in Ray (1 head, 2 worker(s))"
    assert f.evidence == ["rc-head-x (head, 10.0.0.1): ALIVE in Ray, 0 GPUs",
                          "rc-gpu-w-a (worker, 10.0.0.2): ALIVE in Ray, 8 GPUs",
                          "rc-gpu-w-b (worker, 10.0.0.3): ALIVE in Ray, 8 GPUs"]


def test_a_ready_worker_ray_does_not_list_is_a_problem_naming_it():
    f = check_ray_membership([HEAD, W1, W2], {"nodes": [node("10.0.0.1"), node("10.0.0.2", 8)]})
    assert f.status == "problem" and f.summary == "1 Ready pod(s) not in Ray: rc-gpu-w-b"
    assert "rc-gpu-w-b (worker, 10.0.0.3): Ready, not a node of Ray" in f.evidence
    assert "6379" in f.fix and "kubectl logs" in f.fix


def test_a_node_whose_pod_is_gone_is_a_warning_and_a_missing_pod_outranks_it():
    replacement = pod("rc-gpu-w-c", "worker", "10.0.0.4", ready=False)  # not Ready yet: not compared
    nodes = [node("10.0.0.1"), node("10.0.0.2", 8), node("10.0.0.3", 8)]
    f = check_ray_membership([HEAD, W1, replacement], {"nodes": nodes})
    assert f.status == "warning" and f.summary == "Ray lists 1 ALIVE node(s) that no pod has: 10.0.0.3"
    assert "10.0.0.3: ALIVE in Ray (8 GPUs), no pod of this RayCluster has this IP" in f.evidence
    assert "health check" in f.fix
    f = check_ray_membership([HEAD, replacement, pod("rc-gpu-w-d", "worker", "10.0.0.5")], {"nodes": nodes})
    assert f.status == "problem" and "rc-gpu-w-d" in f.summary


def test_a_pod_being_deleted_still_owns_its_node_but_is_not_required_in_ray():
    going = pod("rc-gpu-w-b", "worker", "10.0.0.3", deleting=True)
    assert check_ray_membership([HEAD, W1, going], {"nodes": [node("10.0.0.1"), node("10.0.0.2", 8),
                                                               node("10.0.0.3", 8)]}).status == "ok"
    assert check_ray_membership([HEAD, W1, going], {"nodes": [node("10.0.0.1"), node("10.0.0.2", 8)]}).status == "ok"


def test_no_ready_pod_is_skipped():
    f = check_ray_membership([pod("rc-head-x", "head", None, ready=False)], {"nodes": []})
    assert f.status == "skipped"
