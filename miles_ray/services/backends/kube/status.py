"""A RayCluster's status as Kubernetes (and Ray, and the Polyaxon run behind it) report it, and what each of its workers
requests."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters import kube, ray_jobs
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.heads import k8s_address
from miles_ray.core.queues import kueue_pending_reason, kueue_queue_of, kueue_queued
from miles_ray.services import polyaxon_where
from miles_ray.services.backends.kube.bookkeeping import cluster_record, get_raycluster
from miles_ray.services.backends.results import KubeStatus


def raycluster_status(cfg: MilesRayConfig, api, name: str, with_ray: bool = False) -> KubeStatus:
    """The RayCluster ``name`` and its pods as Kubernetes reports them (with its Polyaxon run's status when
    'up' recorded one); ``with_ray``: also Ray's own count of the nodes alive (a port-forward to the head)."""
    rec = cluster_record(cfg)
    rc = get_raycluster(api, cfg, name)
    pods = kube.cluster_pods(api, cfg.namespace, name)
    st = rc.get("status", {})
    groups = rc["spec"].get("workerGroupSpecs") or []
    gpus_per_worker = int(kube.quantity(_worker_wants(groups[0]).get(kube.GPU, 0))) if groups else 0
    ready = st.get("readyWorkerReplicas", 0)
    out: dict[str, Any] = {
        "name": cfg.name, "backend": "kubernetes", "via": rec.get("via", "kuberay"), "raycluster": name,
        "namespace": cfg.namespace, "desired_workers": sum(g.get("replicas", 0) for g in groups),
        "ready_workers": ready, "gpus_per_worker": gpus_per_worker,
        "desired_gpus": int(kube.quantity(st.get("desiredGPU", 0))), "ready_gpus": ready * gpus_per_worker,
        "state": st.get("state"), "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")} for c in st.get("conditions") or []],
        "generation": rc["metadata"].get("generation"), "observed_generation": st.get("observedGeneration"),
        "pods": pods, "head_service": f"{name}-head-svc",
        "dashboard_url": f"http://{name}-head-svc.{cfg.namespace}.svc:8265",
        # fields the shared table printer expects
        "nodes": [{"index": i, "is_head": p["role"] == "head", "state": p["phase"] + ("" if not p["reason"] else f" ({p['reason']})"),
                   "gpus": gpus_per_worker if p["role"] == "worker" else 0, "cpus": "", "node_ip": p["node"] or ""}
                  for i, p in enumerate(pods)],
        "gpu_node_count": ready, "total_gpus": ready * gpus_per_worker,
    }
    if kueue_queue_of(rc) is not None:  # suspended here means queued by Kueue, not parked
        out["queue"] = {"kind": "kueue", "queue": kueue_queue_of(rc), "queued": kueue_queued(rc)}
        if kueue_queued(rc):
            out["queue"]["reason"] = kueue_pending_reason(
                kube.kueue_workload(api, cfg.namespace, rc["metadata"].get("uid", "")))
    if rec.get("polyaxon_uuid"):
        out["polyaxon_uuid"] = rec["polyaxon_uuid"]
        try:
            ref = polyaxon_where.resolve("cluster", rec, cfg)
            run = polyaxon_where.client(ref, retries=1).get_run(ref.owner, ref.project, ref.uuid,
                                                                with_conditions=False)
            out["polyaxon_status"] = run.get("status")
        except (ClusterError, ConfigError) as e:  # status must still show the cluster
            out["polyaxon_status"] = f"unknown ({str(e).splitlines()[0][:120]})"
    if with_ray:
        try:
            with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context,
                           kubeconfig=cfg.kubeconfig) as url:
                topo = ray_jobs.cluster_topology(url)
            out["ray_nodes_alive"] = len(topo["nodes"])  # cluster_topology lists ALIVE nodes only
            out["ray_gpus"] = sum(n["gpus"] for n in topo["nodes"])
            # which pods Ray sees: a pod deleted a moment ago stays ALIVE in Ray until its health check fails
            out["ray_node_ips"] = sorted(n["ip"] for n in topo["nodes"] if n.get("ip"))
        except ClusterError as e:
            out["ray_nodes_alive"] = None
            out["ray_error"] = str(e)
    return KubeStatus(**out)


def _worker_wants(group: dict[str, Any] | None) -> dict[str, Any]:
    """What each worker of ``group`` asks for (its Ray container): its limits, overridden by its requests."""
    containers = (((group or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}
    return {**(res.get("limits") or {}), **(res.get("requests") or {})}


def worker_shape(group: dict[str, Any] | None, cfg: MilesRayConfig) -> tuple[int, float, float]:
    """GPUs, CPU and memory (bytes) each worker of ``group`` requests (its Ray container), as the cluster was made;
    the configured values where the group does not say."""
    want = _worker_wants(group)
    gpus = int(kube.quantity(want[kube.GPU])) if kube.GPU in want else cfg.gpus_per_node
    cpu = kube.quantity(want["cpu"]) if "cpu" in want else cfg.worker_cpu_request
    memory = kube.quantity(want["memory"]) if "memory" in want else kube.quantity(cfg.memory_per_node)
    return gpus, cpu, memory
