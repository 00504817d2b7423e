"""A thin layer over ``CustomObjectsApi`` for ``ray.io/v1`` RayClusters that raises real errors.

The upstream KubeRay Python client is not on PyPI and swallows errors; this one turns every failure into one typed
error (:func:`.client.api_error`) with one clear line (what failed, on what, why)."""

from __future__ import annotations

import time
from typing import Callable

from miles_ray.adapters.kube.client import api_error, http_status
from miles_ray.core.errors import ClusterError, ConfigError, Conflict, Invalid, NotFound

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
CONFLICT_RETRIES = 6


class RayClusters:
    """create/get/list/patch/delete of ``ray.io/v1`` RayClusters, raising typed errors (see :func:`api_error`)."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)

    def get(self, namespace: str, name: str) -> dict | None:
        try:
            return self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except Exception as e:  # noqa: BLE001 - mapped to a typed error
            if http_status(e) == 404:
                return None
            raise api_error(e, f"get RayCluster {namespace}/{name}") from None

    def list(self, namespace: str, label_selector: str = "") -> list[dict]:
        try:
            return self.api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                          label_selector=label_selector)["items"]
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"list RayClusters in {namespace}") from None

    def create(self, body: dict, dry_run: bool = False) -> dict:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        kwargs = {"dry_run": "All"} if dry_run else {}
        try:
            return self.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body,
                                                            field_validation="Strict", **kwargs)
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"create RayCluster {ns}/{name}{' (server dry run)' if dry_run else ''}") from None

    def delete(self, namespace: str, name: str, propagation: str = "Foreground") -> bool:
        """Delete the RayCluster (``propagation``: Foreground, its dependents first; Background for one whose own
        finalizer needs its dependents, e.g. KubeRay's Redis cleanup Job of a GCS fault-tolerant cluster)."""
        try:
            self.api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                     propagation_policy=propagation)
            return True
        except Exception as e:  # noqa: BLE001
            if http_status(e) == 404:
                return False
            raise api_error(e, f"delete RayCluster {namespace}/{name}") from None

    def delete_owner(self, namespace: str, ref: dict) -> bool:
        """Delete the object an ``ownerReferences`` entry of a RayCluster names (e.g. the ``polyaxon.com/v1 Cluster``
        Polyaxon's agent made it from); its garbage collector then takes the RayCluster. False when it is gone."""
        group, _, version = ref["apiVersion"].rpartition("/")
        plural = ref["kind"].lower() + "s"
        try:
            self.api.delete_namespaced_custom_object(group, version, namespace, plural, ref["name"],
                                                     propagation_policy="Background")
            return True
        except Exception as e:  # noqa: BLE001
            if http_status(e) == 404:
                return False
            raise api_error(e, f"delete {ref['kind']} {namespace}/{ref['name']}") from None

    def json_patch(self, namespace: str, name: str, ops: list[dict]) -> dict:
        try:
            return self.api.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, ops, _content_type="application/json-patch+json")
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"patch RayCluster {namespace}/{name}") from None

    def set_replicas(self, namespace: str, name: str, group: str, replicas: int,
                     on_retry: Callable[[str], None] | None = None) -> tuple[dict, list[str]]:
        """Set a worker group's replicas with a JSON patch guarded by ``test`` ops on the group name and the
        resourceVersion; min/max replicas are moved explicitly (KubeRay would clamp silently). Retries on
        conflict with fresh state. Returns the patched object and the notes on what else changed."""
        last: ClusterError | None = None
        for attempt in range(CONFLICT_RETRIES):
            rc = self.get(namespace, name)
            if rc is None:
                raise NotFound(f"RayCluster {namespace}/{name} does not exist",
                               hint="'miles-ray status' lists what is there; create it with 'miles-ray up'")
            groups = rc.get("spec", {}).get("workerGroupSpecs") or []
            index = next((i for i, g in enumerate(groups) if g.get("groupName") == group), None)
            if index is None:
                names = ", ".join(g.get("groupName", "?") for g in groups) or "none"
                raise ConfigError(f"RayCluster {name} has no worker group {group!r} (groups: {names})",
                                  hint="pass the group with --worker-group or set worker_group in the config")
            g = groups[index]
            base = f"/spec/workerGroupSpecs/{index}"
            ops: list[dict] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
                {"op": "test", "path": f"{base}/groupName", "value": group},
                {"op": "replace" if "replicas" in g else "add", "path": f"{base}/replicas", "value": replicas},
            ]
            notes: list[str] = []
            if g.get("maxReplicas") is not None and replicas > g["maxReplicas"]:
                ops.append({"op": "replace", "path": f"{base}/maxReplicas", "value": replicas})
                notes.append(f"maxReplicas {g['maxReplicas']} -> {replicas}")
            if g.get("minReplicas") is not None and replicas < g["minReplicas"]:
                ops.append({"op": "replace", "path": f"{base}/minReplicas", "value": replicas})
                notes.append(f"minReplicas {g['minReplicas']} -> {replicas}")
            try:
                return self.json_patch(namespace, name, ops), notes
            except (Conflict, Invalid) as e:  # a guarding 'test' op failed (422) or a lost race (409)
                if attempt + 1 < CONFLICT_RETRIES:
                    last = e
                    if on_retry:
                        on_retry(f"RayCluster changed while scaling (HTTP {e.status}); retrying on fresh state")
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise
        raise last or Conflict(f"scaling RayCluster {namespace}/{name} failed after {CONFLICT_RETRIES} attempts")
