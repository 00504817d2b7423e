"""What the real Polyaxon-made pods showed (tests/realpods/test_polyaxon_path.py), held in the pure parts: a
container beside Ray that ended in a pod that never restarts it (Polyaxon's restartPolicy Never) is a pod that
will never be Ready, which the wait reports at once instead of timing out; the Ray container itself, a pod being
deleted and a pod that restarts its containers are not. And a Polyaxon-made pod being deleted lingers for its
whole grace period (its sidecar), which is what may be cut once Ray has stopped in it."""

from __future__ import annotations

from kubernetes import client

from miles_ray.adapters.kube.pods import lingering_sidecar, pod_rows


def _pod(restart: str | None, sidecar_state: client.V1ContainerState, deleting: bool = False,
         ray_state: client.V1ContainerState | None = None) -> client.V1Pod:
    running = client.V1ContainerState(running=client.V1ContainerStateRunning())
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="plx-operation-u-head", namespace="ns", labels={"ray.io/node-type": "head"},
                                     deletion_timestamp="2026-12-05T00:00:00Z" if deleting else None),
        spec=client.V1PodSpec(restart_policy=restart, node_name="n",
                              containers=[client.V1Container(name="polyaxon-main"),
                                          client.V1Container(name="polyaxon-sidecar")]),
        status=client.V1PodStatus(phase="Running", container_statuses=[
            client.V1ContainerStatus(name="polyaxon-main", ready=ray_state is None, restart_count=0, image="i",
                                     image_id="", state=ray_state or running),
            client.V1ContainerStatus(name="polyaxon-sidecar", ready=False, restart_count=0, image="i", image_id="",
                                     state=sidecar_state)]))


EXITED = client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=2, reason="Error"))


def test_a_sidecar_that_ended_under_restart_policy_never_is_fatal_and_named():
    [row] = pod_rows([_pod("Never", EXITED)])
    assert row["fatal"] is True and row["reason"] == "ContainerExited"
    assert "container polyaxon-sidecar exited (code 2, Error)" in row["message"]
    assert "kubectl -n ns logs plx-operation-u-head -c polyaxon-sidecar" in row["message"]


def test_not_fatal_when_restarted_deleting_or_the_ray_container():
    for pod in (_pod("Always", EXITED), _pod(None, EXITED), _pod("Never", EXITED, deleting=True),
                _pod("Never", client.V1ContainerState(running=client.V1ContainerStateRunning()), ray_state=EXITED)):
        [row] = pod_rows([pod])
        assert row["fatal"] is False and row["reason"] == "", row


def _deleting(pod: client.V1Pod, grace: int | None) -> client.V1Pod:
    pod.metadata.deletion_timestamp = "2026-12-05T00:00:30Z"
    pod.metadata.deletion_grace_period_seconds = grace
    return pod


RUNNING = client.V1ContainerState(running=client.V1ContainerStateRunning())


def test_a_polyaxon_pod_being_deleted_with_grace_left_lingers():
    """Polyaxon's sidecar waits out the grace period of a pod being deleted (the real pods showed it): such a pod
    is one whose grace may be cut once Ray has stopped in it (kube/sidecars.LingeringSidecars)."""
    assert lingering_sidecar(_deleting(_pod("Never", RUNNING), 30)) is True


def test_not_lingering_when_not_deleted_already_cut_not_polyaxons_or_not_running():
    kuberay_pod = _deleting(_pod("Always", RUNNING), 30)
    kuberay_pod.spec.containers = [client.V1Container(name="ray-worker")]
    done = _deleting(_pod("Never", RUNNING), 30)
    done.status.phase = "Succeeded"
    for pod in (_pod("Never", RUNNING), _deleting(_pod("Never", RUNNING), 1), _deleting(_pod("Never", RUNNING), None),
                kuberay_pod, done):
        assert lingering_sidecar(pod) is False, pod
