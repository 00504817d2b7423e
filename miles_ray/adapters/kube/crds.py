"""Installed CustomResourceDefinitions (the RayCluster CRD and its schema, the queue CRDs) and custom objects of
other kinds (a Kueue LocalQueue, a Volcano Queue): what the preflight reads before creating anything."""

from __future__ import annotations

from miles_ray.adapters.kube.client import api_error, http_status
from miles_ray.adapters.kube.rayclusters import VERSION

CRD_NAME = "rayclusters.ray.io"


def read_crd(api_client, crd_name: str) -> dict | None:
    """The installed CRD ``crd_name`` as plain JSON (camelCase keys, as stored), or None when it is not installed."""
    from kubernetes import client

    try:
        crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(crd_name)
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return None
        raise api_error(e, f"read CRD {crd_name}") from None
    return api_client.sanitize_for_serialization(crd)


def raycluster_crd(api_client) -> dict | None:
    """The installed RayCluster CRD (see :func:`read_crd`), or None when it is not installed."""
    return read_crd(api_client, CRD_NAME)


def crd_served_versions(crd: dict) -> list[str]:
    return [v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("served")]


def crd_schema(crd: dict, version: str = VERSION) -> dict | None:
    """The ``openAPIV3Schema`` of one version of a CRD (as :func:`raycluster_crd` returns it), if it has one."""
    for v in crd.get("spec", {}).get("versions", []):
        if v.get("name") == version:
            return (v.get("schema") or {}).get("openAPIV3Schema")
    return None


def installed_crd_versions(api_client, crd_name: str) -> list[str] | None:
    """Served versions of CRD ``crd_name`` (e.g. ``localqueues.kueue.x-k8s.io``), or None when it is not
    installed."""
    crd = read_crd(api_client, crd_name)
    return None if crd is None else crd_served_versions(crd)


def custom_object_exists(api_client, group: str, version: str, plural: str, name: str,
                         namespace: str | None = None) -> bool:
    """Whether the custom object exists (namespaced when ``namespace`` is given, else cluster-scoped)."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    try:
        if namespace is None:
            api.get_cluster_custom_object(group, version, plural, name)
        else:
            api.get_namespaced_custom_object(group, version, namespace, plural, name)
        return True
    except Exception as e:  # noqa: BLE001
        if http_status(e) == 404:
            return False
        where = f"{namespace}/{name}" if namespace else name
        raise api_error(e, f"read {plural}.{group} {where}") from None
