"""The run supervisor of a run on a KubeRay cluster: a Kubernetes Job beside the RayCluster
(:mod:`miles_ray.core.supervisor_job`), in the cluster's pinned image, owned by the RayCluster. It needs no
Kubernetes API access: it reaches the Ray head's dashboard through the head Service name, reads the run's
checkpoint dir on the cluster's claim, and says what it does in its log lines; this handle reads those through the
Kubernetes API (the Job's pods' logs, its conditions and termination message) and deletes the Job on stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miles_ray.adapters import kube, state
from miles_ray.adapters.kube import supervisors
from miles_ray.adapters.kube.rayclusters import RayClusters
from miles_ray.controller.program import program_files
from miles_ray.core import supervisor_job as sj
from miles_ray.core.errors import ClusterError, NotFound
from miles_ray.core.heads import parse_head
from miles_ray.services.saved_runs import SAVED_EVENTS  # in the run's saved copy dir (runs/RUN.saved/)

KIND = "kubernetes"


def in_cluster_spec(spec: dict[str, Any], raycluster: dict[str, Any]) -> dict[str, Any]:
    """``spec`` as the supervisor pod sees the cluster: the head's dashboard by its Service name, the Ray token
    (when the cluster runs with one) as the file the Job mounts from the token Secret."""
    out = dict(spec)
    out["head_url"] = sj.head_dashboard_url(raycluster)
    out["token_file"] = sj.TOKEN_FILE if sj.token_secret(raycluster) else None
    return out


class KubeSupervisor:
    """The Kubernetes ``SupervisorHandle`` (:mod:`miles_ray.services.runs.supervised`): ``where`` (kept in the run
    record's ``supervisor.where``) is ``{"namespace", "cluster", "job", "uid", "kube_context", "kubeconfig"}``;
    before the start it is taken from the run's record (its ``k8s://NS/NAME`` address)."""

    kind = KIND

    def __init__(self, run: str, where: dict[str, Any] | None = None) -> None:
        self.run = run
        self._where = dict(where) if where else None
        self._api = None

    @property
    def where(self) -> dict[str, Any]:
        """Where the supervisor is; before its start, from the run's record (created before the start)."""
        if self._where is None:
            record = state.RunStore.load(self.run)
            head = parse_head(record.address)
            self._where = {"namespace": head.namespace, "cluster": head.name,
                           "kube_context": record.kube_context, "kubeconfig": record.kubeconfig}
        return self._where

    @property
    def namespace(self) -> str:
        return self.where["namespace"]

    @property
    def cluster(self) -> str:
        return self.where["cluster"]

    @property
    def api(self):
        if self._api is None:
            self._api = kube.load_client(self.where.get("kubeconfig"), self.where.get("kube_context"))
        return self._api

    def start(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Create the supervisor's ConfigMap and Job (both, or neither) for ``spec``, rewritten for the pod
        (:func:`in_cluster_spec`); returns ``where``. A run with a Polyaxon run of its own (the spec's ``polyaxon``
        section) is supervised in the image that section names (its reporter needs polyaxon)."""
        rc = RayClusters(self.api).get(self.namespace, self.cluster)
        if rc is None:
            raise NotFound(f"RayCluster {self.namespace}/{self.cluster} does not exist: no supervisor can be started "
                           "for it", hint="'miles-ray up --via kuberay' creates it")
        program = program_files()
        configmap = sj.build_configmap(rc, self.run, program, in_cluster_spec(spec, rc))
        job = supervisors.create(self.api, configmap, sj.build_job(rc, self.run, program,
                                                                      image=(spec.get("polyaxon") or {}).get("image")))
        self.where.update(job=job["metadata"]["name"], uid=job["metadata"]["uid"])
        return dict(self.where)

    def head_url(self, reached: str, in_cluster: str) -> str:  # noqa: ARG002 -- the pod never uses a port-forward
        """The head as the pod reaches it: its Service's name (:meth:`start` writes the fully qualified one)."""
        return in_cluster

    def token_file(self, token: str) -> str:  # noqa: ARG002 -- the pod reads the token Secret, never a copy
        """The token file inside the supervisor pod (mounted from the cluster's token Secret)."""
        return sj.TOKEN_FILE

    def _saved_events(self) -> Path:
        return state.saved_dir(self.run) / SAVED_EVENTS

    def events(self) -> list[dict[str, Any]]:
        """Every event the supervisor printed, over all its pods and restarts, in order. A copy is kept beside the
        run's record, read once the Job is gone (stopped, or deleted with its cluster by ``down``)."""
        saved = state.read_json(self._saved_events())
        try:
            events = supervisors.events(self.api, self.namespace, self.run)
        except ClusterError:
            if isinstance(saved, list):
                return saved
            raise
        if not events and isinstance(saved, list) and supervisors.read_job(self.api, self.namespace, self.run) is None:
            return saved
        if events != saved:
            self._saved_events().parent.mkdir(parents=True, exist_ok=True)
            state.atomic_write_json(self._saved_events(), events)
        return events

    def alive(self) -> bool | None:
        """Whether its Job runs (or restarts its pod); None when the Kubernetes API does not answer."""
        try:
            return supervisors.alive(self.api, self.namespace, self.run)
        except ClusterError:
            return None

    def stop(self) -> None:
        """Delete the Job and its ConfigMap and wait until its pods are gone: nothing resubmits the run after. Its
        events are kept first (:meth:`events`)."""
        self.events()
        supervisors.delete(self.api, self.namespace, self.run)
