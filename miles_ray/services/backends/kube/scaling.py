"""Resizing a RayCluster's worker group, with its guards: the runs on it, Kueue, KubeRay's autoscaler."""

from __future__ import annotations

import time
from typing import Any, Callable

from miles_ray.adapters import kube
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, Conflict, TimedOut
from miles_ray.core.heads import k8s_address, service_url
from miles_ray.core.progress import Progress, say as _say
from miles_ray.core.queues import kueue_queue_of
from miles_ray.services import saved_runs
from miles_ray.services.backends.kube.bookkeeping import client, cluster_record, get_raycluster
from miles_ray.services.backends.kube.status import worker_shape
from miles_ray.services.backends.kube.waits import POLL, wait_ready
from miles_ray.services.backends.results import KubeScale
from miles_ray.services.runs import live_status


def scale(cfg: MilesRayConfig, nodes: int, progress: Progress = None, timeout: float = 600, force: bool = False,
          wait: bool = True, ray_check: bool = True) -> KubeScale:
    """Resize the worker group of the configured cluster's RayCluster and (``wait``) wait until the new size is
    ready (and in Ray). Refuses when Kueue admits the cluster
    (unless ``force``), below what a running job needs (unless ``force``), and a growth that cannot fit (the
    autoscaler is :func:`refuse_scale_if_autoscaled`'s, checked first)."""
    api = client(cfg)
    rec = cluster_record(cfg)
    name = rec["raycluster"]
    rays = kube.RayClusters(api)
    current = get_raycluster(api, cfg, name)
    groups = current["spec"].get("workerGroupSpecs") or []
    group = next((g for g in groups if g.get("groupName") == cfg.worker_group), None)
    now = group.get("replicas", 0) if group is not None else None
    gpus, cpu, memory = worker_shape(group, cfg)
    queue = kueue_queue_of(current)
    if queue is not None and now is not None and nodes != now and not force:
        raise Conflict(f"Kueue admits RayCluster {name} (queue {queue!r}): to Kueue a new size is a new Workload, so "
                       "it suspends the whole cluster (every pod, the head included: Ray restarts and running jobs "
                       "are lost) and admits it again once the new size fits its quota",
                       hint="pass --force to resize anyway, once no job needs the running Ray cluster")
    if now is not None and nodes < now and not force:
        refuse_shrink(cfg, name, nodes)
    if now is not None and nodes > now:
        preflight_grow = kube.gpu_capacity(api, cfg.node_selector, [t.model_dump(exclude_none=True) for t in cfg.tolerations])
        fit = preflight_grow.fitting(gpus, cpu, memory)
        if len(fit) < nodes - now:
            raise ClusterError(f"not enough free GPU nodes to grow from {now} to {nodes}: {len(fit)} fit "
                               f"{gpus} GPU(s), {cpu:g} CPU and {memory / 2**30:.0f}Gi free, as each worker of "
                               f"{name} requests", hint="use a smaller --nodes or free GPUs")
    _, notes = rays.set_replicas(cfg.namespace, name, cfg.worker_group, nodes, on_retry=progress)
    for n in notes:
        _say(progress, f"adjusted {n} (explicitly, so KubeRay does not clamp the new size)")
    result = KubeScale(**{"name": cfg.name, "raycluster": name, "from": now, "to": nodes, "adjusted": notes,
                          "gpus_per_worker": gpus})
    if wait:
        start = time.monotonic()
        if queue is not None and nodes != now:
            _wait_kueue_workload(api, cfg, name, current["metadata"]["uid"], nodes, progress, timeout)
        result.with_status(wait_ready(cfg, api, name, nodes, progress, max(5.0, timeout - (time.monotonic() - start)),
                                      ray_check and nodes > 0))
    return result


def _wait_kueue_workload(api, cfg: MilesRayConfig, name: str, uid: str, nodes: int, progress: Progress,
                         timeout: float) -> None:
    """After a resize under Kueue: until Kueue has replaced the Workload by one of the new size (it suspends the
    cluster first), so that waiting for the pods does not take the old ones for the new size."""
    _say(progress, f"waiting for Kueue to replace the Workload of {name} by one of {nodes} worker(s) (it suspends "
                   "the whole cluster meanwhile)")
    deadline = time.monotonic() + timeout
    while True:
        wl = kube.kueue_workload(api, cfg.namespace, uid)
        sets = {s.get("name"): s.get("count") for s in ((wl or {}).get("spec") or {}).get("podSets") or []}
        if sets.get(cfg.worker_group) == nodes:
            return
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for Kueue to replace the Workload of {name} "
                           f"by one of {nodes} worker(s)", hint=f"'kubectl get workloads -n {cfg.namespace}' shows it")
        time.sleep(POLL)


def refuse_shrink(cfg: MilesRayConfig, name: str, nodes: int) -> None:
    """Refuse to shrink RayCluster ``name`` below what a pending or running run on it needs, or when a run on it
    cannot be read (--force overrides)."""
    on_it = saved_runs.records_on([k8s_address(cfg.namespace, name), service_url(cfg.namespace, name)])
    for rec in on_it:
        if rec.cluster != cfg.name:
            continue
        need = int((rec.split or {}).get("nodes", 0))
        if need <= nodes:
            continue
        st = live_status(rec)
        if st in {"PENDING", "RUNNING"}:
            raise ConfigError(f"run {rec.run!r} is {st} and needs {need} GPU nodes; refusing to scale to {nodes}",
                              hint="stop the run first, or pass --force")
        if st == "UNREACHABLE":
            raise ConfigError(f"cannot tell whether run {rec.run!r} (needs {need} GPU nodes) is still running",
                              hint="check with 'miles-ray status RUN', or pass --force")


def autoscaler_owner(rc: dict[str, Any]) -> str | None:
    """Why a manual scale would fight over this RayCluster's replicas, or None: KubeRay's in-tree autoscaler owns
    them when ``spec.enableInTreeAutoscaling`` is true."""
    if (rc.get("spec") or {}).get("enableInTreeAutoscaling") is True:
        return "KubeRay's in-tree autoscaler (spec.enableInTreeAutoscaling: true)"
    return None


def refuse_scale_if_autoscaled(cfg: MilesRayConfig) -> None:
    """``scale`` on Kubernetes: refuse, saying what to do, when the autoscaler owns the replicas (it would undo a
    manual size, and its scale-downs remove pods of its choosing)."""
    name = cluster_record(cfg)["raycluster"]
    rc = get_raycluster(client(cfg), cfg, name)
    owner = autoscaler_owner(rc)
    if owner:
        raise Conflict(f"RayCluster {cfg.namespace}/{name} is scaled by {owner}; a manual scale would be undone",
                       hint=f"let it scale within minReplicas/maxReplicas of group {cfg.worker_group!r} (edit those "
                            "with kubectl), or set spec.enableInTreeAutoscaling: false and run 'miles-ray scale' again")


def guarded(cfg: MilesRayConfig, name: str) -> Callable[[], None]:
    """The running-job guard of parking (shrinking to 0 GPU nodes) a RayCluster."""
    return lambda: refuse_shrink(cfg, name, 0)
