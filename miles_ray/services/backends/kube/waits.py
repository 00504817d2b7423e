"""The waits on a RayCluster: its pods scheduled, running and ready, then its GPU workers ALIVE in Ray (a fresh or
resized cluster); its pods gone (a deleted one)."""

from __future__ import annotations

import time
from typing import Any

from miles_ray.adapters import kube, ray_jobs
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, TimedOut, Unreachable
from miles_ray.core.heads import k8s_address
from miles_ray.core.progress import Progress, say as _say
from miles_ray.core.queues import kueue_pending_reason, kueue_queue_of, kueue_queued
from miles_ray.services.backends.kube.sidecars import LingeringSidecars
from miles_ray.services.backends.kube.status import raycluster_status
from miles_ray.services.backends.results import KubeStatus


POLL = 1.0
UNSCHEDULABLE_POLLS = 2  # an Unschedulable condition seen on this many polls in a row fails the wait


def _summary(rc: dict | None, pods: list[dict], want: int) -> str:
    workers = [p for p in pods if p["role"] == "worker"]
    head = next((p for p in pods if p["role"] == "head"), None)
    scheduled = sum(1 for p in workers if p["node"])
    running = sum(1 for p in workers if p["phase"] == "Running")
    st = (rc or {}).get("status", {})
    return (f"head {head['phase'] if head else 'not created'}; workers scheduled {scheduled}/{want}, "
            f"running {running}/{want}; RayCluster ready workers {st.get('readyWorkerReplicas', 0)}/{want}")


def wait_ready(cfg: MilesRayConfig, api, name: str, want: int, progress: Progress, timeout: float,
               ray_check: bool) -> KubeStatus:
    """Pods scheduled -> running -> RayCluster ready -> N GPU workers ALIVE in Ray. Fails fast on pods that
    cannot be scheduled or whose containers cannot start; survives API server restarts until the timeout."""
    rays = kube.RayClusters(api)
    deadline = time.monotonic() + timeout
    unschedulable_seen: dict[str, int] = {}
    last = ""
    queued = ""  # why Kueue holds the cluster back, while it does
    lingering = LingeringSidecars(cfg, api, name, progress)  # a scale-down's pods, on the Polyaxon path
    while True:
        try:
            rc = rays.get(cfg.namespace, name)
            pods = kube.pod_rows(lingering.pods())
            queued = _kueue_wait(api, cfg.namespace, name, rc) if kueue_queued(rc) else ""
        except Unreachable:  # no answer, 5xx or 429: the API server may be restarting
            _say(progress, "Kubernetes API unreachable; still waiting")
            rc, pods = None, None
        if queued:  # Kueue creates no pod of a gang it has not admitted: nothing else to watch
            if queued != last:
                _say(progress, queued)
                last = queued
        elif pods is not None:
            for p in pods:
                if p["reason"] == "Unschedulable":
                    unschedulable_seen[p["name"]] = unschedulable_seen.get(p["name"], 0) + 1
                    if unschedulable_seen[p["name"]] >= UNSCHEDULABLE_POLLS:
                        raise ClusterError(f"pod {p['name']} cannot be scheduled: {p['message']}",
                                           hint="free GPUs, add nodes, or check node_selector/tolerations/quotas; "
                                                "the RayCluster is left in place ('miles-ray down' removes it)")
                elif p["fatal"]:
                    raise ClusterError(f"pod {p['name']} cannot start: {p['reason']}: {p['message'][:300]}",
                                       hint="check the image reference and pull secrets (ImagePullBackOff) or "
                                            "'miles-ray logs'/kubectl logs (CrashLoopBackOff)")
                else:
                    unschedulable_seen.pop(p["name"], None)
            msg = _summary(rc, pods, want)
            if msg != last:
                _say(progress, msg)
                last = msg
            st = (rc or {}).get("status", {})
            meta = (rc or {}).get("metadata", {})
            workers_ready = len(_ready_workers(pods))
            if (rc is not None and st.get("observedGeneration", 0) >= meta.get("generation", 1)
                    and st.get("readyWorkerReplicas", 0) == want and workers_ready == want
                    and st.get("desiredWorkerReplicas", want) == want):
                break
        if time.monotonic() > deadline:
            if queued:
                raise TimedOut(f"timed out after {timeout:.0f}s: {queued}",
                               hint=f"the RayCluster stays queued, with no pods, until Kueue admits it; "
                                    f"'miles-ray up' again keeps waiting, 'miles-ray down' removes it; "
                                    f"'kubectl get workloads -n {cfg.namespace}' shows the queue")
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for {name}: {last}",
                           hint="'miles-ray status' shows each pod's reason")
        time.sleep(POLL)
    out = raycluster_status(cfg, api, name)
    if ray_check:
        out.ray = _wait_ray_joined(cfg, api, name, want, progress, max(5.0, deadline - time.monotonic()))
    return out


def _kueue_wait(api, namespace: str, name: str, rc: dict) -> str:
    """The progress line of a RayCluster Kueue has not admitted yet: its queue and Kueue's reason."""
    workload = kube.kueue_workload(api, namespace, rc["metadata"].get("uid", ""))
    return (f"waiting for Kueue to admit RayCluster {namespace}/{name} (LocalQueue {kueue_queue_of(rc)}; the whole "
            f"gang at once, no pods until then): {kueue_pending_reason(workload)}")


def _ready_workers(pods: list[dict]) -> list[dict]:
    """The worker pods (of ``kube.cluster_pods``) that are ready and not being deleted."""
    return [p for p in pods if p["role"] == "worker" and p["ready"] and not p["deleting"]]


def _wait_ray_joined(cfg: MilesRayConfig, api, name: str, want: int, progress: Progress, timeout: float) -> dict:
    """Wait until ``want`` GPU worker pods of now are ALIVE in Ray (matched by pod IP, and started after their pod:
    the Ray node of a pod deleted a moment ago stays ALIVE until its health check fails and does not count; the
    rule is :func:`miles_ray.core.supervision.gpu_workers_ready`, the run supervisor's too)."""

    def worker_ips() -> dict[str, float | None]:
        pods = kube.list_pods(api, cfg.namespace, kube.cluster_selector(name))
        ready = {p["name"] for p in _ready_workers(kube.pod_rows(pods))}
        return {p.status.pod_ip: (p.metadata.creation_timestamp.timestamp() * 1000
                                  if p.metadata.creation_timestamp else None)
                for p in pods if p.metadata.name in ready and p.status.pod_ip}

    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        _say(progress, f"waiting for {want} GPU worker(s) to join Ray (dashboard via port-forward {url})")
        return ray_jobs.wait_for_gpu_nodes(url, want, cfg.gpus_per_node, timeout, progress, among=worker_ips)


def wait_gone(cfg: MilesRayConfig, api, name: str, out: Any, timeout: float) -> None:
    """Wait until the RayCluster ``name`` and its pods are gone, even when the RayCluster already is: its pods still
    go gracefully (preStop: ray stop) and hold their GPUs until they are gone (``out.pods_remaining``: what was left
    at the timeout; ``out.grace_cut``: the Polyaxon-made pods :class:`LingeringSidecars` cut short)."""
    deadline = time.monotonic() + timeout
    lingering = LingeringSidecars(cfg, api, name)
    while lingering.pods() or kube.RayClusters(api).get(cfg.namespace, name):
        if time.monotonic() > deadline:
            out.pods_remaining = len(kube.cluster_pods(api, cfg.namespace, name))
            break
        time.sleep(POLL)
    out.grace_cut = sorted(lingering.cut)
