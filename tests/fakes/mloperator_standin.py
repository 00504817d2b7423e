"""FAKE — a stand-in for Polyaxon's operator (mloperator), used only where the real one cannot run here.

Why a fake: mloperator is a Go program, and the Go module proxy that this project's machines and CI reach
refuses ``github.com/polyaxon/mloperator`` (every version: "403 Forbidden: This module version is not
available"). ``cluster/polyaxon_stack.py`` still tries the real one first; the Polyaxon e2e test uses this
stand-in only when that build fails because the registry refuses the module, and says so in its output.

What it does, the one step of mloperator's that the test needs: for each ``polyaxon.com/v1 Cluster`` in a
namespace, create the ``ray.io/v1 RayCluster`` of the same name from its ``rayClusterSpec`` the way
mloperator's Ray manager maps a replica spec (labels of the operation minus ``app.kubernetes.io/name`` on
every pod template, ``rayStartParams`` defaulting to ``{}``, a worker group without a name becomes
``worker-<i>``, the pod spec as is), owned by the Cluster. Everything after that — pods, scheduling,
GPU placement — is the real KubeRay operator's and the real control plane's work.

What is ASSUMED of the operator that cannot be read here (its Cluster manager is not public):
- a replica's ``restartPolicy`` (Polyaxon's converter puts it on the replica, ``Never`` unless the
  operation says otherwise: polyaxon/_k8s/custom_resources/ray_cluster.py) becomes the pod template's
  ``spec.restartPolicy``, as Polyaxon's operators do for every other replica kind (a RayCluster group has
  no field of its own for it, so the template is the only place it can go);
- the template's ``metadata`` carries the replica's labels and annotations as the converter made them;
- deleting the Cluster deletes the RayCluster (the ownerReference: the garbage collector does it).
"""

from __future__ import annotations

import threading
from typing import Any

NAME_LABEL = "app.kubernetes.io/name"


def _template(replica: dict[str, Any], labels: dict[str, str], name: str | None = None) -> dict[str, Any]:
    """A replica's pod template: the converter's pod spec with the replica's restartPolicy (see the module
    docstring), its labels (the operation's) and annotations."""
    tmpl = replica.get("template") or {}
    md = tmpl.get("metadata") or {}
    spec = dict(tmpl["spec"])
    if replica.get("restartPolicy"):
        spec["restartPolicy"] = replica["restartPolicy"]
    meta: dict[str, Any] = {"labels": {**{k: v for k, v in (md.get("labels") or {}).items() if k != NAME_LABEL},
                                       **labels}}
    if md.get("annotations"):
        meta["annotations"] = dict(md["annotations"])
    if name:
        meta["name"] = name
    return {"metadata": meta, "spec": spec}


def raycluster_for(cr: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster that stands for Polyaxon ``Cluster`` custom resource ``cr``."""
    md = cr["metadata"]
    name = md["name"]
    labels = {k: v for k, v in (md.get("labels") or {}).items() if k != NAME_LABEL}
    spec = cr["rayClusterSpec"]
    head = spec["head"]
    workers = []
    for i, w in enumerate(spec.get("workers") or []):
        workers.append({
            "groupName": w.get("groupName") or f"worker-{i}",
            "replicas": w.get("replicas", 1),
            "minReplicas": w.get("minReplicas", w.get("replicas", 1)),
            "maxReplicas": w.get("maxReplicas", w.get("replicas", 1)),
            "rayStartParams": dict(w.get("rayStartParams") or {}),
            "template": _template(w, labels),
        })
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name, "namespace": md["namespace"], "labels": labels,
            "ownerReferences": [{"apiVersion": cr["apiVersion"], "kind": cr["kind"], "name": name,
                                 "uid": md["uid"], "controller": True}],
        },
        "spec": {
            "rayVersion": spec.get("rayVersion"),
            "headGroupSpec": {
                "rayStartParams": dict(head.get("rayStartParams") or {}),
                "template": _template(head, labels, name=f"{name}-head"),
            },
            "workerGroupSpecs": workers,
        },
    }


class MloperatorStandIn:
    """Reconciles Clusters in one namespace into RayClusters until stopped (a thread, polled)."""

    def __init__(self, custom_objects: Any, namespace: str, interval: float = 0.5) -> None:
        self.api = custom_objects
        self.namespace = namespace
        self.interval = interval
        self.created: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mloperator-standin", daemon=True)

    def start(self) -> "MloperatorStandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def reconcile_once(self) -> None:
        from kubernetes.client.rest import ApiException

        crs = self.api.list_namespaced_custom_object("polyaxon.com", "v1", self.namespace, "clusters")["items"]
        have = {rc["metadata"]["name"] for rc in self.api.list_namespaced_custom_object(
            "ray.io", "v1", self.namespace, "rayclusters")["items"]}
        for cr in crs:
            name = cr["metadata"]["name"]
            if name in have:
                continue
            try:
                self.api.create_namespaced_custom_object("ray.io", "v1", self.namespace, "rayclusters",
                                                         raycluster_for(cr))
                self.created.append(name)
            except ApiException as e:
                if e.status != 409:
                    self.errors.append(f"{name}: HTTP {e.status} {e.reason}: {(e.body or '')[:300]}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as e:  # noqa: BLE001 — recorded and shown by the test that waits on us
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(self.interval)
