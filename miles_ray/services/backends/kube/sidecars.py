"""A Polyaxon-made pod being deleted holds its GPUs for its whole grace period after its Ray stopped (Polyaxon's
sidecar waits it out): :class:`LingeringSidecars` deletes such a pod at once, for the waits."""

from __future__ import annotations

import time
from typing import Any

from miles_ray.adapters import kube
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, Forbidden
from miles_ray.core.progress import Progress, say as _say


#: Ray's dashboard agent listens on this port in every pod KubeRay makes (``--dashboard-agent-listen-port``), on
#: the pod's loopback too, and stops with the pod's Ray: nothing answers there once Ray has stopped in the pod.
RAY_AGENT_PORT = 52365
#: A pod's agent port must refuse twice, this far apart, before its grace period is cut: the raylet ends a moment
#: after its agent (``ray stop`` signals both) and tells the GCS it is leaving on its way out.
REFUSED_FOR_SECONDS = 1.0


class LingeringSidecars:
    """Deletes at once (grace 0) a Polyaxon-made pod being deleted, once Ray has stopped in it.

    Polyaxon's sidecar (beside Ray in every pod its agent makes) ignores SIGTERM and waits until the API shows its
    Ray container ended; the kubelet posts that only once every container of the pod has ended, so every such pod
    holds its node's GPUs for its whole grace period (30 s) although Ray stopped (the converter's ``preStop: ray
    stop``) within seconds. Once the pod's Ray agent port refuses connections twice, ``REFUSED_FOR_SECONDS`` apart,
    only the sidecar is left running, and the kubelet would kill it at the end of the grace period anyway. A shorter
    grace period (1 s) does not help: the kubelet keeps killing with the one it started with (seen on real pods), so
    the pod is deleted with grace 0: its object goes at once, and its node kills the sidecar. Nothing is cut on any
    other answer: a port-forward refused by RBAC or an unreachable node says nothing about Ray."""

    def __init__(self, cfg: MilesRayConfig, api, name: str, progress: Progress = None) -> None:
        self.cfg, self.api, self.name, self.progress = cfg, api, name, progress
        self.refused: dict[str, float] = {}  # pod -> when its agent port first refused
        self.cut: set[str] = set()
        self.forbidden = False

    def pods(self) -> list[Any]:
        """The cluster's pods (``V1Pod``) of now, each lingering one checked (and deleted at once when its Ray has
        stopped): a waiting loop lists them once per poll, here, and summarises them with ``kube.pod_rows``."""
        pods = kube.list_pods(self.api, self.cfg.namespace, kube.cluster_selector(self.name))
        for pod in [] if self.forbidden else pods:
            pod_name = pod.metadata.name
            if pod_name in self.cut or not kube.lingering_sidecar(pod):
                continue
            if not kube.port_refused(self.api, self.cfg.namespace, pod_name, RAY_AGENT_PORT, wait=1.5):
                self.refused.pop(pod_name, None)
                continue
            first = self.refused.setdefault(pod_name, time.monotonic())
            if time.monotonic() - first < REFUSED_FOR_SECONDS:
                continue
            try:
                kube.delete_pod(self.api, self.cfg.namespace, pod_name, 0)
            except Forbidden:
                self.forbidden = True
                _say(self.progress, "cannot delete Polyaxon-made pods whose Ray has stopped (pods delete is not "
                                    "granted): they go when their grace period ends")
                break
            except ClusterError:  # the API did not take it this time (restarting, throttled): the next poll tries
                continue
            self.cut.add(pod_name)
            _say(self.progress, f"Ray has stopped in pod {pod_name}; only Polyaxon's sidecar was left, waiting out "
                                "the grace period: deleted the pod at once (grace 0)")
        return pods
