"""Kueue: the Workload that stands for a RayCluster (its admission, its suspension)."""

from __future__ import annotations

from miles_ray.adapters.kube.client import api_error, http_status


def kueue_workload(api_client, namespace: str, owner_uid: str) -> dict | None:
    """The Kueue Workload that stands for the object ``owner_uid`` (Kueue names it after the object and sets an
    owner reference to it), or None when there is none (or the Workload CRD is not served)."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    for version in ("v1beta2", "v1beta1"):
        try:
            items = api.list_namespaced_custom_object("kueue.x-k8s.io", version, namespace, "workloads")["items"]
        except Exception as e:  # noqa: BLE001
            if http_status(e) == 404:
                continue
            raise api_error(e, f"list Kueue workloads in {namespace}") from None
        return next((w for w in items if any(r.get("uid") == owner_uid
                                             for r in w["metadata"].get("ownerReferences") or [])), None)
    return None
