"""Reads of core objects that the preflight and ``doctor`` check: the namespace, a PersistentVolumeClaim, the
namespace's ResourceQuotas, a Service's ports; and a short-lived probe pod run once (:func:`run_pod_once`)."""

from __future__ import annotations

import time
from typing import Any, Callable

from miles_ray.adapters.kube.client import api_error, http_status, pod_log
from miles_ray.adapters.kube.pods import waiting_why


def namespace_exists(api_client, namespace: str) -> bool:
    from kubernetes import client

    try:
        client.CoreV1Api(api_client).read_namespace(namespace)
        return True
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return False
        raise api_error(e, f"read namespace {namespace}") from None


def pvc_exists(api_client, namespace: str, claim: str) -> bool:
    from kubernetes import client

    try:
        client.CoreV1Api(api_client).read_namespaced_persistent_volume_claim(claim, namespace)
        return True
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return False
        raise api_error(e, f"read PersistentVolumeClaim {namespace}/{claim}") from None


def list_quotas(api_client, namespace: str) -> list[Any]:
    """The namespace's ``V1ResourceQuota`` objects."""
    from kubernetes import client

    try:
        return client.CoreV1Api(api_client).list_namespaced_resource_quota(namespace).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list ResourceQuotas in {namespace}") from None


def service_ports(api_client, namespace: str, name: str) -> list[int] | None:
    """The ports of Service ``namespace/name``, or None when it does not exist."""
    from kubernetes import client

    try:
        svc = client.CoreV1Api(api_client).read_namespaced_service(name, namespace)
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return None
        raise api_error(e, f"read Service {namespace}/{name}") from None
    return [p.port for p in (svc.spec.ports or [])]


def run_pod_once(api_client, pod: dict[str, Any], timeout: float, on_wait: Callable[[str], None] | None = None,
                 poll: float = 1.0) -> tuple[str, str]:
    """Create the short-lived ``pod`` (``restartPolicy: Never``), wait until it has ended (bounded by ``timeout``;
    ``on_wait`` gets a line whenever what it waits for changes), and delete it whatever happened (also on
    Ctrl-C). Returns (its phase: Succeeded, Failed, or why it never ran -- a fatal waiting reason such as
    ErrImagePull, Unschedulable or TimedOut --, and its log). Raises the typed error of a failed API call."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    try:
        core.create_namespaced_pod(namespace, pod)
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"create pod {namespace}/{name}") from None
    deadline = time.monotonic() + timeout
    last, phase = "", ""
    try:
        while True:
            try:
                p = core.read_namespaced_pod(name, namespace)
            except Exception as e:  # noqa: BLE001
                raise api_error(e, f"read pod {namespace}/{name}") from None
            phase = p.status.phase or "Pending"
            if phase in ("Succeeded", "Failed"):
                break
            why, fatal = waiting_why(p)
            if fatal:
                return why, ""
            if why != last and on_wait is not None:
                on_wait(why)
            last = why
            if time.monotonic() > deadline:
                return f"TimedOut after {timeout:.0f}s ({last})", ""
            time.sleep(poll)
        try:
            log = pod_log(core, name, namespace)
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"read the log of pod {namespace}/{name}") from None
        return phase, log
    finally:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except Exception as e:  # noqa: BLE001 -- already gone is fine; anything else is said
            if http_status(e) != 404:
                raise api_error(e, f"delete pod {namespace}/{name}") from None

def service_account_denied(api_client, namespace: str, service_account: str,
                           wanted: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """Which of ``wanted`` (verb, resource[/subresource]) in ``namespace`` the service account may NOT do, asked
    of the API server's authorizer (LocalSubjectAccessReview: no pod is started). None when the caller may not
    ask (403/401/404): then nothing is known."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(api_client)
    user = f"system:serviceaccount:{namespace}:{service_account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    denied = []
    for verb, res in wanted:
        resource, _, sub = res.partition("/")
        review = client.V1LocalSubjectAccessReview(
            metadata=client.V1ObjectMeta(namespace=namespace),
            spec=client.V1SubjectAccessReviewSpec(user=user, groups=groups, resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group="", resource=resource, subresource=sub or None)))
        try:
            answer = authz.create_namespaced_local_subject_access_review(namespace, review)
        except Exception as e:  # noqa: BLE001
            if http_status(e) in (401, 403, 404):
                return None
            raise api_error(e, f"ask the API server what {user} may do") from None
        if not (answer.status and answer.status.allowed):
            denied.append((verb, res))
    return denied
