"""Cluster lifecycle that saves GPU hours: who owns the worker replicas (KubeRay's autoscaler), park and resume,
and idle detection."""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any, Callable

from miles_ray.adapters import kube, local_ray, polyaxon_api, ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, Conflict, NotFound, TimedOut
from miles_ray.core.heads import k8s_address
from miles_ray.services import clusters, k8s_clusters
from miles_ray.core.progress import Progress, say as _say

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POLL = 1.0


def _iso(ts: float | None) -> str | None:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def autoscaler_owner(rc: dict[str, Any]) -> str | None:
    """Why a manual scale would fight over this RayCluster's replicas, or None: KubeRay's in-tree autoscaler owns
    them when ``spec.enableInTreeAutoscaling`` is true."""
    if (rc.get("spec") or {}).get("enableInTreeAutoscaling") is True:
        return "KubeRay's in-tree autoscaler (spec.enableInTreeAutoscaling: true)"
    return None


def refuse_scale_if_autoscaled(cfg: MilesRayConfig) -> None:
    """``scale`` on Kubernetes: refuse, saying what to do, when the autoscaler owns the replicas (it would undo a
    manual size, and its scale-downs remove pods of its choosing)."""
    name = k8s_clusters.cluster_record(cfg)["raycluster"]
    rc = kube.RayClusters(kube.load_client(cfg.kubeconfig, cfg.kube_context)).get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    owner = autoscaler_owner(rc)
    if owner:
        raise Conflict(f"RayCluster {cfg.namespace}/{name} is scaled by {owner}; a manual scale would be undone",
                       hint=f"let it scale within minReplicas/maxReplicas of group {cfg.worker_group!r} (edit those "
                            "with kubectl), or set spec.enableInTreeAutoscaling: false and run 'miles-ray scale' again")


# -- idle detection -------------------------------------------------------------------------------

def idle_report(url: str) -> dict[str, Any]:
    """Is the cluster at ``url`` idle, and since when: no job pending or running and no active driver (the
    dashboard's activity API). ``since`` is the latest of: the last job's end, the head's start. ``idle`` is None
    when Ray cannot tell.

    Ray's job list holds every driver that is not a job's (status RUNNING while it lives) besides the submitted
    jobs, so drivers the activity API counts while the list shows nothing pending or running belong to jobs that
    have ended (seen a few seconds after 'stop' on a loaded machine: the stopped job listed STOPPED, one driver still
    counted). Those are not activity (the reason says so). When the activity API fails, the job list alone decides."""
    return judge_idle(ray_jobs.activity(url), ray_jobs.list_jobs(url))


def judge_idle(act: dict[str, Any], jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`idle_report` from what Ray answered: ``act`` (:func:`ray_jobs.activity`) and ``jobs``
    (:func:`ray_jobs.list_jobs`)."""
    now = act.get("observed_at") or time.time()
    busy = [j["job_id"] for j in jobs if j.get("status") in ("PENDING", "RUNNING")]
    if busy:
        why = ", ".join(filter(None, [act.get("reason") if act.get("status") == "ACTIVE" else None,
                                      f"job(s) pending or running: {', '.join(busy)}"]))
        return {"idle": False, "reason": why, "busy_jobs": busy}
    notes = []
    if act.get("status") == "ERROR":
        notes.append(f"the dashboard's activity API failed ({act.get('reason')}); judged from the job list, which "
                     "lists drivers too")
    elif act.get("status") == "ACTIVE":
        notes.append(f"Ray still counts driver(s) of ended jobs as active ({act.get('reason')})")
    ends = [j["end_time"] / 1000 for j in jobs if j.get("end_time")]
    marks = [t for t in (act.get("last_activity_at"), act.get("head_started_at"), *ends) if t]
    if not marks:
        return {"idle": None, "reason": "Ray reports no job and no head start time"}
    since = min(max(marks), now)
    last_job = max([t for t in (act.get("last_activity_at"), *ends) if t], default=None)
    reason = "no job pending or running" + (f"; the last one ended {_iso(last_job)}" if last_job else
                                            "; none has run since the head started")
    return {"idle": True, "since": _iso(since), "idle_seconds": round(now - since, 1),
            "last_job_end": _iso(last_job), "reason": "; ".join([reason, *notes])}


def cluster_idle(cfg: MilesRayConfig, backend: str, local_status: dict | None = None) -> dict[str, Any]:
    """:func:`idle_report` of the configured cluster (a port-forward to the head on Kubernetes)."""
    if backend == "local":
        st = local_status or local_ray.status(state.local_clusters_dir(), cfg.name)
        return idle_report(st["dashboard_url"])
    name = k8s_clusters.cluster_record(cfg)["raycluster"]
    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context,
                   kubeconfig=cfg.kubeconfig) as url:
        return idle_report(url)


def _not_idle_enough(report: dict[str, Any], need: float) -> str | None:
    """Why ``--if-idle-for`` does not park (None: idle long enough)."""
    if report.get("idle") is None:
        return f"cannot tell whether it is idle ({report.get('reason')})"
    if not report["idle"]:
        return f"it is busy ({report.get('reason')})"
    if report["idle_seconds"] < need:
        return f"it has been idle for {report['idle_seconds']:.0f}s only (since {report['since']}), less than {need:.0f}s"
    return None


# -- park / resume --------------------------------------------------------------------------------

def park(cfg: MilesRayConfig, backend: str, *, force: bool = False, if_idle_for: float | None = None,
         wait: bool = True, timeout: float = 300, progress: Progress = None) -> dict[str, Any]:
    """Free the cluster's GPUs and keep everything needed to bring it back with 'resume'. Refuses under a
    running job unless ``force``; with ``if_idle_for`` (seconds) parks only a cluster idle at least that long
    (``parked`` False says why not). The driver logs of the runs on it are saved first (their Ray job info
    goes with the pods)."""
    if backend == "local":
        return _park_local(cfg, force, if_idle_for, progress)
    rec = k8s_clusters.cluster_record(cfg)
    if rec.get("via") == "polyaxon":
        return _park_polyaxon(cfg, rec, force, if_idle_for, progress)
    return _park_kuberay(cfg, rec["raycluster"], force, if_idle_for, wait, timeout, progress)


def _refuse_under_jobs(cfg: MilesRayConfig, guard: Callable[[], None]) -> None:
    """The guard 'scale' applies before shrinking (a pending or running job of this cluster, or one whose state
    cannot be read), applied to parking (shrinking to 0 GPU nodes), in park's words."""
    try:
        guard()
    except ConfigError as e:
        raise ConfigError(f"refusing to park cluster {cfg.name}: {e.message.split(';')[0]}",
                          hint="stop the run first ('miles-ray stop RUN'), or pass --force") from None


def _skip(cfg: MilesRayConfig, why: str, report: dict) -> dict[str, Any]:
    return {"name": cfg.name, "parked": False, "reason": f"not parked: {why}", "idle": report}


def _park_gate(cfg: MilesRayConfig, if_idle_for: float | None, force: bool, idle: Callable[[], dict[str, Any]],
               guard: Callable[[], None]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What every backend checks before parking: ``--if-idle-for`` (``idle()`` reports), then, unless --force, the
    running-job ``guard``. Returns (the 'not parked' answer, or None to go on; the idle report, if one was read)."""
    report = None
    if if_idle_for is not None:
        report = idle()
        why = _not_idle_enough(report, if_idle_for)
        if why:
            return _skip(cfg, why, report), report
    if not force:
        _refuse_under_jobs(cfg, guard)
    return None, report


def _park_local(cfg: MilesRayConfig, force: bool, if_idle_for: float | None, progress: Progress) -> dict[str, Any]:
    if state.read_parked_local(cfg.name) is not None and not clusters.local_exists(cfg.name):
        return {"name": cfg.name, "backend": "local", "parked": True, "already_parked": True}
    st = local_ray.status(state.local_clusters_dir(), cfg.name)
    skip, report = _park_gate(cfg, if_idle_for, force, lambda: cluster_idle(cfg, "local", st),
                              lambda: clusters.refuse_shrink_below_running_jobs(cfg, 0, st))
    if skip:
        return skip
    saved = clusters.save_runs_before_down(cfg, "local")
    shape = {"name": cfg.name, "nodes": st["gpu_node_count"], "gpus_per_node": st.get("gpus_per_node"),
             "cpus_per_node": st.get("cpus_per_node"), "parked_at": _iso(time.time())}
    state.write_parked_local(cfg.name, shape)
    _say(progress, f"stopping the processes of local cluster {cfg.name} (its shape is kept for 'resume')")
    local_ray.down(state.local_clusters_dir(), cfg.name)
    return {"name": cfg.name, "backend": "local", "parked": True, "kept": shape, "saved_runs": saved,
            **({"idle": report} if report else {})}


def _refuse_kueue(rc: dict[str, Any]) -> None:
    queue = ((rc.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if queue:
        name = rc["metadata"]["name"]
        raise Conflict(f"Kueue admits RayCluster {name} (queue {queue!r}) and owns its spec.suspend; miles-ray never "
                       "toggles it under Kueue", hint="'miles-ray down' frees its quota (storage and checkpoints are "
                                                      "kept); or deactivate its Workload with Kueue (spec.active: false)")


def _park_kuberay(cfg: MilesRayConfig, name: str, force: bool, if_idle_for: float | None, wait: bool,
                  timeout: float, progress: Progress) -> dict[str, Any]:
    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    rays = kube.RayClusters(api)
    rc = rays.get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    _refuse_kueue(rc)
    out: dict[str, Any] = {"name": cfg.name, "raycluster": name, "namespace": cfg.namespace, "parked": True}
    if rc["spec"].get("suspend") is True:
        return {**out, "already_parked": True}
    skip, report = _park_gate(cfg, if_idle_for, force, lambda: cluster_idle(cfg, "kubernetes"),
                              lambda: k8s_clusters.refuse_shrink(cfg, name, 0))
    if skip:
        return skip
    if report:
        out["idle"] = report
    if state.list_records():
        out["saved_runs"] = clusters.save_runs_before_down(cfg, "kubernetes")
    rays.json_patch(cfg.namespace, name, [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/spec/suspend", "value": True}])
    _say(progress, f"suspended RayCluster {cfg.namespace}/{name}; KubeRay deletes its pods (the object, claims "
                   "and checkpoints stay)")
    if wait:
        deadline = time.monotonic() + timeout
        while pods := kube.cluster_pods(api, cfg.namespace, name):
            if time.monotonic() > deadline:
                raise TimedOut(f"RayCluster {name} is suspended but {len(pods)} pod(s) are still there after "
                               f"{timeout:.0f}s", hint="'miles-ray status' shows them; 'miles-ray park' again waits")
            _say(progress, f"waiting for {len(pods)} pod(s) to go")
            time.sleep(POLL)
    return out


def _polyaxon(cfg: MilesRayConfig) -> polyaxon_api.PolyaxonApi:
    return polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host)


def _park_polyaxon(cfg: MilesRayConfig, rec: dict[str, Any], force: bool, if_idle_for: float | None,
                   progress: Progress) -> dict[str, Any]:
    """Polyaxon owns its RayCluster (the run's operator would undo a suspend): stop the run, keep the operation
    it was created from, and 'resume' creates it again."""
    out: dict[str, Any] = {"name": cfg.name, "via": "polyaxon", "parked": True}
    if rec.get("parked"):
        return {**out, "already_parked": True, "operation_of": rec["parked"]["stopped_uuid"]}
    skip, report = _park_gate(cfg, if_idle_for, force, lambda: cluster_idle(cfg, "kubernetes"),
                              lambda: k8s_clusters.refuse_shrink(cfg, rec["raycluster"], 0))
    if skip:
        return skip
    if report:
        out["idle"] = report
    client = _polyaxon(cfg)
    run = client.get_run(rec["polyaxon_owner"], rec["polyaxon_project"], rec["polyaxon_uuid"], with_conditions=False)
    if not isinstance(run.get("raw_content"), dict):
        raise ClusterError(f"Polyaxon run {rec['polyaxon_uuid']} does not return the operation it was created from",
                           hint="'miles-ray down' then 'up' instead")
    if state.list_records():
        out["saved_runs"] = clusters.save_runs_before_down(cfg, "kubernetes")
    parked = {"operation": run["raw_content"], "run_name": run.get("name") or cfg.name, "tags": run.get("tags"),
              "meta": run.get("meta_info"), "stopped_uuid": rec["polyaxon_uuid"], "parked_at": _iso(time.time())}
    state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name, {**rec, "parked": parked})
    client.stop_run(rec["polyaxon_owner"], rec["polyaxon_project"], rec["polyaxon_uuid"])
    _say(progress, f"stopped Polyaxon run {rec['polyaxon_uuid']}; its operation is kept for 'resume'")
    return {**out, "stopped_uuid": rec["polyaxon_uuid"]}


def resume(cfg: MilesRayConfig, backend: str, *, wait: bool = True, ray_check: bool = True, timeout: float = 600,
           progress: Progress = None) -> dict[str, Any]:
    """Bring a parked cluster back and (``wait``) wait until every GPU worker has rejoined Ray, as 'up' does.
    A cluster that is not parked is only waited for."""
    if backend == "local":
        parked = state.read_parked_local(cfg.name)
        if parked is None:
            st = local_ray.status(state.local_clusters_dir(), cfg.name)  # NotFound when there is none
            return {**st, "resumed": False, "reason": "it was not parked"}
        st = local_ray.up(state.local_clusters_dir(), cfg.name, parked["nodes"], parked["gpus_per_node"],
                          parked["cpus_per_node"], progress=progress, timeout=timeout)
        state.remove_parked_local(cfg.name)
        return {**st, "resumed": True}
    rec = k8s_clusters.cluster_record(cfg)
    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    if rec.get("via") == "polyaxon":
        return _resume_polyaxon(cfg, rec, api, wait, ray_check, timeout, progress)
    name = rec["raycluster"]
    rays = kube.RayClusters(api)
    rc = rays.get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    _refuse_kueue(rc)
    out: dict[str, Any] = {"name": cfg.name, "raycluster": name, "namespace": cfg.namespace}
    groups = rc["spec"].get("workerGroupSpecs") or []
    want = next((g.get("replicas", 0) for g in groups if g.get("groupName") == cfg.worker_group), None)
    if want is None:
        raise ConfigError(f"RayCluster {name} has no worker group {cfg.worker_group!r}",
                          hint="set worker_group in the config")
    out["resumed"] = rc["spec"].get("suspend") is True
    if out["resumed"]:
        rays.json_patch(cfg.namespace, name, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/spec/suspend", "value": False}])
        _say(progress, f"unsuspended RayCluster {cfg.namespace}/{name}; waiting for {want} GPU worker(s)")
    else:
        out["reason"] = "it was not parked"
    if wait:
        out["status"] = k8s_clusters.wait_ready(cfg, api, name, want, progress, timeout, ray_check and want > 0)
    return out


def _resume_polyaxon(cfg: MilesRayConfig, rec: dict[str, Any], api, wait: bool, ray_check: bool, timeout: float,
                     progress: Progress) -> dict[str, Any]:
    parked = rec.get("parked")
    if not parked:
        return {"name": cfg.name, "via": "polyaxon", "resumed": False, "reason": "it was not parked",
                "polyaxon_uuid": rec.get("polyaxon_uuid")}
    uuid = _polyaxon(cfg).create_operation(rec["polyaxon_owner"], rec["polyaxon_project"], parked["operation"],
                                           name=parked["run_name"], tags=parked.get("tags"), meta=parked.get("meta"),
                                           reuse_existing=False)
    raycluster = f"plx-operation-{uuid}"
    new = {k: v for k, v in rec.items() if k != "parked"}
    new.update(polyaxon_uuid=uuid, raycluster=raycluster, resumed_from=parked["stopped_uuid"])
    state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name, new)
    _say(progress, f"created Polyaxon run {uuid} from the operation of run {parked['stopped_uuid']}")
    out: dict[str, Any] = {"name": cfg.name, "via": "polyaxon", "resumed": True, "polyaxon_uuid": uuid,
                           "raycluster": raycluster, "resumed_from": parked["stopped_uuid"]}
    if wait:
        want = next(iter(parked["operation"]["component"]["run"]["workers"].values())).get("replicas", 0)
        out["status"] = k8s_clusters.wait_ready(cfg, api, raycluster, want, progress, timeout, ray_check and want > 0)
    return out


def pick_backend(backend: str, cfg: MilesRayConfig) -> str:
    """As :func:`miles_ray.services.clusters.pick_backend`, and 'auto' also finds a parked local cluster."""
    if backend == "auto" and state.read_parked_local(cfg.name) is not None:
        return "local"
    return clusters.pick_backend(backend, cfg)


def parked_record(cfg: MilesRayConfig, backend: str) -> dict[str, Any] | None:
    """What 'park' kept of a parked local or Polyaxon cluster, or None (a parked KubeRay cluster is still an
    object: 'status' shows it suspended)."""
    if backend == "local":
        parked = None if clusters.local_exists(cfg.name) else state.read_parked_local(cfg.name)
        return None if parked is None else {"name": cfg.name, "backend": "local", "parked": True, **parked}
    rec = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name)) or {}
    if rec.get("parked"):
        p = rec["parked"]
        return {"name": cfg.name, "backend": "kubernetes", "via": "polyaxon", "parked": True,
                "parked_at": p.get("parked_at"), "stopped_uuid": p.get("stopped_uuid")}
    return None
