"""Reads of core objects that the preflight and ``doctor`` check: the namespace, a PersistentVolumeClaim, the
namespace's ResourceQuotas, a Service's ports."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters.kube.client import api_error, http_status


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
