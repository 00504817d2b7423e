"""A RayCluster's pods: listed raw (for diagnosis that needs every field) or summarised (phase, node,
readiness and why not running), which waiting reasons are fatal, and the running head pod."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters.kube.client import api_error
from miles_ray.core.errors import NotFound, Unreachable

FATAL_WAITING = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError",
                 "InvalidImageName", "CreateContainerError", "RunContainerError"}
# A container that crashed fewer times than this is still given a chance: a Ray worker exits when its head
# restarts and a slow node can time out Ray's first start, and both recover on the kubelet's next restart
# (10 s, 20 s, 40 s back-off). From the third restart on, CrashLoopBackOff is a verdict, not a hiccup.
CRASHLOOP_RESTARTS = 3


def waiting_is_fatal(reason: str, restart_count: int) -> bool:
    """Whether a container waiting for ``reason`` after ``restart_count`` restarts will not start by itself."""
    if reason == "CrashLoopBackOff":
        return restart_count >= CRASHLOOP_RESTARTS
    return reason in FATAL_WAITING


def waiting_why(pod: Any) -> tuple[str, bool]:
    """Why a pod that has not ended is not running yet, in one phrase (its phase, ``Unschedulable: ...``, or its
    container's waiting ``reason: message``), and whether that reason is fatal (:func:`waiting_is_fatal`)."""
    why = pod.status.phase or "Pending"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            why = f"Unschedulable: {c.message or ''}".strip()
    for cs in pod.status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason:
            why = f"{waiting.reason}: {waiting.message or ''}".strip(": ")
            if waiting_is_fatal(waiting.reason, cs.restart_count or 0):
                return why, True
    return why, False


def list_pods(api_client, namespace: str, label_selector: str = "") -> list[Any]:
    """The raw ``V1Pod`` objects matching ``label_selector`` (for diagnosis that needs every field)."""
    from kubernetes import client

    try:
        return client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=label_selector).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list pods in {namespace}" + (f" ({label_selector})" if label_selector else "")) from None


def cluster_selector(cluster: str, role: str | None = None) -> str:
    """The label selector of a RayCluster's pods (KubeRay labels), optionally only the head or the workers."""
    return f"ray.io/cluster={cluster}" + (f",ray.io/node-type={role}" if role else "")


def cluster_pods(api_client, namespace: str, cluster: str) -> list[dict]:
    """Pods of a RayCluster with phase, node and the reason they are not running (if any)."""
    return pod_rows(list_pods(api_client, namespace, cluster_selector(cluster)))


def pod_rows(pods: list[Any]) -> list[dict]:
    """``cluster_pods``'s rows for pods already listed: phase, node, readiness, IP and why not running."""
    out = []
    for p in pods:
        labels = p.metadata.labels or {}
        reason, message, fatal = "", "", False
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                reason, message = c.reason or "Unschedulable", c.message or ""
        for cs in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason:
                reason, message = waiting.reason, waiting.message or ""
                if waiting.reason == "CrashLoopBackOff":
                    message = f"restarted {cs.restart_count or 0} time(s); {message}"
                fatal = waiting_is_fatal(waiting.reason, cs.restart_count or 0)
        if p.spec.restart_policy == "Never" and p.status.phase == "Running" and p.metadata.deletion_timestamp is None:
            # A container beside Ray (Polyaxon's sidecar) that ended in a pod that never restarts it (Polyaxon's pods:
            # restartPolicy Never) leaves the pod unready for good: KubeRay never reports the cluster ready, so say
            # so instead of waiting. (The Ray container, the first, is KubeRay's: it replaces a pod whose Ray ended.)
            ray = p.spec.containers[0].name if p.spec.containers else None
            for cs in p.status.container_statuses or []:
                done = cs.state.terminated if cs.state and cs.name != ray else None
                if done is not None:
                    reason, fatal = "ContainerExited", True
                    message = (f"container {cs.name} exited (code {done.exit_code}, {done.reason or 'no reason'}) and "
                               f"the pod's restartPolicy is Never, so the pod never becomes Ready (kubectl -n "
                               f"{p.metadata.namespace} logs {p.metadata.name} -c {cs.name})")
        ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        out.append({
            "name": p.metadata.name,
            "role": labels.get("ray.io/node-type", "?"),
            "group": labels.get("ray.io/group", ""),
            "phase": p.status.phase,
            "ready": ready,
            "node": p.spec.node_name,
            "reason": reason,
            "message": message,
            "fatal": fatal or reason == "Unschedulable",
            "deleting": p.metadata.deletion_timestamp is not None,
            "ip": p.status.pod_ip,
        })
    return sorted(out, key=lambda d: (d["role"] != "head", d["name"]))


#: The container Polyaxon's converter adds beside Ray in every pod its agent makes.
POLYAXON_SIDECAR = "polyaxon-sidecar"


def lingering_sidecar(pod: Any) -> bool:
    """Whether ``pod`` (a ``V1Pod``) is a Polyaxon-made pod being deleted with more than a second of grace: Polyaxon's
    sidecar ignores SIGTERM and waits until the API shows its Ray container ended, which the kubelet
    posts only once every container of the pod has ended, so such a pod always takes its whole grace period (30 s)."""
    meta, spec = pod.metadata, pod.spec
    return (meta.deletion_timestamp is not None and (meta.deletion_grace_period_seconds or 0) > 1
            and pod.status.phase == "Running" and any(c.name == POLYAXON_SIDECAR for c in spec.containers or []))


def delete_pod(api_client, namespace: str, name: str, grace_seconds: int) -> bool:
    """Delete pod ``name`` with ``grace_seconds`` of grace (0: its object goes at once, and its node kills what
    still runs in it); False when it is already gone."""
    from kubernetes import client

    try:
        client.CoreV1Api(api_client).delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)
        return True
    except Exception as e:  # noqa: BLE001
        err = api_error(e, f"delete pod {namespace}/{name}")
        if isinstance(err, NotFound):
            return False
        raise err from None


def running_head_pod(api_client, namespace: str, cluster: str) -> Any:
    """The RayCluster's running head pod (``V1Pod``); NotFound when it has none, Unreachable when
    it is not running (yet)."""
    pods = list_pods(api_client, namespace, cluster_selector(cluster, "head"))
    if not pods:
        raise NotFound(f"RayCluster {namespace}/{cluster} has no head pod",
                       hint="'miles-ray status' shows what is there; 'miles-ray up' creates it")
    running = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    if not running:
        states = ", ".join(f"{p.metadata.name} {p.status.phase}" for p in pods)
        raise Unreachable(f"the head pod of RayCluster {namespace}/{cluster} is not running ({states})",
                          hint="'miles-ray status' shows why; 'miles-ray up' waits for it")
    return running[0]
