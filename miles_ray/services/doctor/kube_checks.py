"""Doctor's Kubernetes checks: what the RayCluster spec and its pods say (Pending pods and whether one node can
supply their GPUs, container failures, /dev/shm, GPU limits vs Ray's GPUs, the external-Ray setting and the head
address, image and Ray-version drift, and whether every Ready pod is a node of Ray). Reads through
:mod:`miles_ray.adapters.kube`'s public functions."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from miles_ray.adapters import kube, ray_jobs
from miles_ray.adapters.kube import GPU, gpu_capacity, quantity
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, NotFound
from miles_ray.services.doctor.findings import OK, PROBLEM, SKIPPED, WARNING, Finding, finding
from miles_ray.services.heads import kube_raycluster
from miles_ray.core.progress import Progress


def _quotas(api, namespace: str, evidence: list[str]) -> list[Any]:
    """The namespace's quotas: evidence, not a requirement (RBAC may hide them; then that is said)."""
    try:
        return kube.list_quotas(api, namespace)
    except ClusterError as e:
        evidence.append(f"ResourceQuotas of {namespace} not readable ({e.message})")
        return []


# -- helpers over specs --------------------------------------------------------------------------

def _groups(rc: dict) -> list[tuple[str, dict, dict]]:
    """(group name, rayStartParams, pod template spec) for the head and each worker group."""
    spec = rc.get("spec", {})
    out = [("headgroup", spec.get("headGroupSpec", {}).get("rayStartParams", {}) or {},
            spec.get("headGroupSpec", {}).get("template", {}).get("spec", {}))]
    for g in spec.get("workerGroupSpecs") or []:
        out.append((g.get("groupName", "?"), g.get("rayStartParams", {}) or {}, g.get("template", {}).get("spec", {})))
    return out


def _ray_container(pod_spec: dict) -> dict:
    containers = pod_spec.get("containers") or [{}]
    return next((c for c in containers if c.get("name") in ("ray", "ray-head", "ray-worker", "polyaxon-main")),
                containers[0])


def _digest(ref: str | None) -> str | None:
    m = re.search(r"(sha256:[0-9a-f]{64})", ref or "")
    return m.group(1) if m else None


def _requests(pod) -> dict[str, float]:
    acc = {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}
    for c in pod.spec.containers or []:
        req = (c.resources.requests or {}) if c.resources else {}
        lim = (c.resources.limits or {}) if c.resources else {}
        acc["gpu"] += quantity(req.get(GPU, lim.get(GPU, 0)))
        acc["cpu"] += quantity(req.get("cpu", 0))
        acc["memory"] += quantity(req.get("memory", 0))
    return acc


def _gib(b: float) -> str:
    return f"{b / 2**30:g}Gi"


# -- checks: Kubernetes --------------------------------------------------------------------------

def check_pending(api, cfg: MilesRayConfig, pods: list[Any]) -> Finding:
    pending = [p for p in pods if p.status.phase == "Pending" and not p.spec.node_name
               and p.metadata.deletion_timestamp is None]
    if not pending:
        return finding("pods_pending", "pending", OK, f"all {len(pods)} pod(s) are scheduled",
                       [f"{p.metadata.name} on {p.spec.node_name}" for p in pods[:8]])
    evidence: list[str] = []
    fixes: list[str] = []
    by_node_tol: dict[str, Any] = {}
    for p in pending:
        req = _requests(p)
        cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
        msg = (cond.message or cond.reason or "") if cond else "not scheduled yet"
        evidence.append(f"pod {p.metadata.name} needs {req['gpu']:g} {GPU}, {req['cpu']:g} CPU, "
                        f"{_gib(req['memory'])} memory; scheduler: {msg}")
        tolerations = [t.to_dict() for t in (p.spec.tolerations or [])]
        key = repr((sorted((p.spec.node_selector or {}).items()), tolerations))
        if key not in by_node_tol:
            by_node_tol[key] = (p.spec.node_selector or {}, tolerations, req)
        else:
            prev = by_node_tol[key][2]
            if req["gpu"] > prev["gpu"]:
                by_node_tol[key] = (p.spec.node_selector or {}, tolerations, req)
    for selector, tolerations, req in by_node_tol.values():
        cap = gpu_capacity(api, selector, tolerations)
        nodes_line = ", ".join(f"{n.name}: {n.gpus_allocatable:g} allocatable / {n.gpus_free:g} free"
                               + ("" if n.eligible else f" (excluded: {n.why_not})") for n in cap.nodes[:12])
        evidence.append(f"GPU nodes ({len(cap.nodes)}): {nodes_line or 'none'}")
        need = req["gpu"]
        largest = max((n.gpus_allocatable for n in cap.nodes), default=0)
        eligible = [n for n in cap.nodes if n.eligible]
        if need > largest:
            fixes.append(f"no node can supply {need:g} GPUs to one pod (the largest has {largest:g}): request at most "
                         f"{largest:g} per pod (--gpus-per-node {int(largest)}) or add bigger nodes")
        elif not [n for n in eligible if n.gpus_allocatable >= need]:
            fixes.append(f"the nodes with {need:g} GPUs are excluded by node selector/taints/cordon: fix "
                         "node_selector/tolerations or the nodes")
        elif not [n for n in eligible if n.gpus_free >= need and n.cpu_free >= req["cpu"]
                  and n.memory_free >= req["memory"]]:
            fixes.append(f"eligible nodes have {need:g} GPUs but not free (other pods hold them) or lack "
                         f"{req['cpu']:g} CPU / {_gib(req['memory'])}: free them or wait")
    for q in _quotas(api, cfg.namespace, evidence):
        hard, used = (q.status.hard or {}), (q.status.used or {})
        for k in hard:
            if "gpu" in k or k in ("requests.cpu", "requests.memory", "limits.memory", "pods"):
                evidence.append(f"ResourceQuota {q.metadata.name}: {k} used {used.get(k, '0')} of {hard[k]}")
                if quantity(used.get(k, 0)) >= quantity(hard[k]):
                    fixes.append(f"ResourceQuota {q.metadata.name} is exhausted for {k}: raise it or free quota")
    if not fixes:
        fixes.append("inspect the scheduler message above (queue capacity, affinity, volumes)")
    return finding("pods_pending", "pending", PROBLEM,
                   f"{len(pending)} pod(s) stay Pending: " + ", ".join(p.metadata.name for p in pending[:5]),
                   evidence, "; ".join(dict.fromkeys(fixes)))


def check_container_failures(pods: list[Any]) -> Finding:
    evidence: list[str] = []
    for p in pods:
        for cs in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
            waiting = cs.state.waiting if cs.state else None
            last = cs.last_state.terminated if cs.last_state else None
            if waiting and waiting.reason and waiting.reason not in ("ContainerCreating", "PodInitializing"):
                line = f"pod {p.metadata.name} container {cs.name}: {waiting.reason}"
                if waiting.message:
                    line += f": {waiting.message[:200]}"
                if last is not None:
                    line += f" (last exit {last.exit_code} {last.reason or ''}: {(last.message or '')[:200]})".rstrip()
                line += f", restarts {cs.restart_count}"
                evidence.append(line)
            elif last is not None and cs.restart_count:
                evidence.append(f"pod {p.metadata.name} container {cs.name} restarted {cs.restart_count}x, last exit "
                                f"{last.exit_code} {last.reason or ''}")
    if not evidence:
        return finding("container_failures", "startup", OK, "no container is waiting, crashing or restarting")
    return finding("container_failures", "startup", PROBLEM, f"{len(evidence)} container(s) fail to start",
                   evidence, "read the worker logs (kubectl logs POD --previous); ImagePullBackOff: fix the image "
                             "reference or pull secret; CrashLoopBackOff from Ray/NCCL: see shm and GPU checks")


def check_shm(rc: dict) -> Finding:
    evidence, missing = [], []
    for group, _, pod in _groups(rc):
        c = _ray_container(pod)
        mounts = {m.get("name"): m for m in c.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"}
        vols = {v.get("name"): v for v in pod.get("volumes") or []}
        vol = next((vols[n] for n in mounts if n in vols), None)
        if vol is None:
            missing.append(group)
            evidence.append(f"{group}: no volume mounted at /dev/shm (the container runtime's default is 64Mi)")
            continue
        ed = vol.get("emptyDir") or {}
        size = ed.get("sizeLimit", "no sizeLimit (bounded by the pod's memory limit)")
        evidence.append(f"{group}: /dev/shm is {'emptyDir medium ' + ed.get('medium', 'disk') if ed else 'a volume'}, "
                        f"{size}")
        if ed and ed.get("medium") != "Memory":
            missing.append(group)
    if missing:
        return finding("shm", "startup", PROBLEM, f"/dev/shm is not a memory volume in {', '.join(missing)}",
                       evidence, "mount an emptyDir {medium: Memory} at /dev/shm in the ray container (Polyaxon: "
                                 "plugins.shm: true) and size the pod memory to include it; with 64Mi Ray's object "
                                 "store falls back to disk and NCCL's SHM transport fails ('unhandled system error')")
    return finding("shm", "startup", OK, "/dev/shm is a memory volume in every group (it counts toward pod memory)",
                   evidence)


def check_gpu_visibility(rc: dict) -> Finding:
    evidence, bad = [], []
    for group, params, pod in _groups(rc):
        c = _ray_container(pod)
        res = c.get("resources") or {}
        limit = quantity((res.get("limits") or {}).get(GPU, 0))
        ray_gpus = params.get("num-gpus")
        evidence.append(f"{group}: {GPU} limit {limit:g}, rayStartParams num-gpus {ray_gpus if ray_gpus is not None else 'unset (Ray autodetects)'}")
        if ray_gpus is not None and float(ray_gpus) != limit:
            bad.append(f"{group} advertises {ray_gpus} GPUs to Ray but the container gets {limit:g}")
        if group != "headgroup" and limit == 0:
            bad.append(f"{group} has no {GPU} limit: its GPUs are invisible to the container")
    if bad:
        return finding("gpu_visibility", "startup", PROBLEM, "; ".join(bad), evidence,
                       "set rayStartParams num-gpus equal to the nvidia.com/gpu limit of the same group")
    return finding("gpu_visibility", "startup", OK, "every group's nvidia.com/gpu limit matches Ray's num-gpus", evidence)


def check_external_ray(api, cfg: MilesRayConfig, rc: dict, name: str) -> Finding:
    evidence, bad, warn = [], [], []
    for group, _, pod in _groups(rc):
        env = {e.get("name"): e.get("value") for e in _ray_container(pod).get("env") or []}
        ext = env.get("MILES_SCRIPT_EXTERNAL_RAY")
        evidence.append(f"{group}: MILES_SCRIPT_EXTERNAL_RAY={ext if ext is not None else '(unset)'}")
        if (ext or "").lower() not in ("1", "true"):
            warn.append(group)
        addr = env.get("RAY_ADDRESS")
        if addr and (addr.startswith("ray://") or re.search(r":6379\b", addr)):
            bad.append(f"{group} sets RAY_ADDRESS={addr}: the launcher needs the dashboard / Jobs API URL (:8265)")
    svc = f"{name}-head-svc"
    try:
        ports = kube.service_ports(api, cfg.namespace, svc)
    except ClusterError as e:
        bad.append(f"head service {cfg.namespace}/{svc} could not be read ({e.message})")
    else:
        _check_head_service(cfg, svc, ports, evidence, bad)
    fix = ("submit with RAY_ADDRESS=http://<cluster>-head-svc.<ns>.svc:8265 and MILES_SCRIPT_EXTERNAL_RAY=1 "
           "(miles-ray submit sets both); without it the launcher runs 'ray stop' and starts a second cluster")
    if bad:
        return finding("external_ray", "startup", PROBLEM, "; ".join(bad), evidence, fix)
    if warn:
        return finding("external_ray", "startup", WARNING,
                       f"MILES_SCRIPT_EXTERNAL_RAY is not set in {', '.join(warn)}", evidence, fix)
    return finding("external_ray", "startup", OK, "external-Ray setting and head address are consistent", evidence)


def _check_head_service(cfg: MilesRayConfig, svc: str, ports: list[int] | None, evidence: list[str],
                        bad: list[str]) -> None:
    if ports is None:
        bad.append(f"head service {cfg.namespace}/{svc} does not exist")
        return
    evidence.append(f"head address http://{svc}.{cfg.namespace}.svc:8265 (service ports {ports})")
    if 8265 not in ports:
        bad.append(f"head service {svc} does not expose the dashboard port 8265 (ports {ports})")


def check_image_drift(rc: dict, pods: list[Any], cfg: MilesRayConfig) -> Finding:
    want = {g: _ray_container(pod).get("image") for g, _, pod in _groups(rc)}
    evidence = [f"RayCluster spec {g}: {img}" for g, img in want.items()]
    problems: list[str] = []
    if len(set(want.values())) > 1:
        problems.append("head and worker groups name different images in the RayCluster spec")
    running: dict[str, str] = {}
    no_id = []
    for p in pods:
        if p.metadata.deletion_timestamp is not None:
            continue
        labels = p.metadata.labels or {}
        group = "headgroup" if labels.get("ray.io/node-type") == "head" else labels.get("ray.io/group", "?")
        spec_img = (p.spec.containers or [None])[0].image if p.spec.containers else None
        statuses = p.status.container_statuses or []
        st = next((s for s in statuses if s.name == (p.spec.containers[0].name if p.spec.containers else None)), None)
        image_id = (st.image_id if st else "") or ""
        running[p.metadata.name] = spec_img
        line = f"pod {p.metadata.name} ({group}): {spec_img}"
        if image_id:
            line += f", imageID {image_id}"
        else:
            no_id.append(p.metadata.name)
        evidence.append(line)
        template = want.get(group)
        if template and spec_img != template:
            problems.append(f"pod {p.metadata.name} runs {spec_img} but the RayCluster's {group} template says "
                            f"{template} (KubeRay does not recreate running pods)")
        d_spec, d_run = _digest(spec_img), _digest(image_id)
        if d_spec and d_run and d_spec != d_run:
            problems.append(f"pod {p.metadata.name} asked for {d_spec[:19]} but runs {d_run[:19]}")
    if no_id:
        evidence.append(f"imageID not reported for {len(no_id)} pod(s) (not pulled yet, or fake nodes): compared "
                        "the pods' image references")
    if len(set(running.values())) > 1:
        problems.append(f"running pods use {len(set(running.values()))} different images")
    rv = rc.get("spec", {}).get("rayVersion")
    evidence.append(f"rayVersion {rv}")
    if cfg.ray_version and rv and rv != cfg.ray_version:
        problems.append(f"RayCluster rayVersion {rv} != configured ray_version {cfg.ray_version}")
    if problems:
        return finding("image_drift", "drift", PROBLEM, "; ".join(dict.fromkeys(problems)), evidence,
                       "recreate the drifted pods (delete them: KubeRay makes new ones from the template) or "
                       "'miles-ray down' and 'up' with one pinned image; never change the image under a running job")
    return finding("image_drift", "drift", OK, "every pod runs the RayCluster's image", evidence)


def kube_findings(cfg: MilesRayConfig, progress: Progress) -> tuple[list[Finding], list[dict],
                                                                   Callable[[str | None, str | None], Finding]]:
    """Every Kubernetes check of the configured cluster, its pods (``kube.pod_rows``, for the checks against
    Ray) and its GCS fault-tolerance check (:func:`check_gcs_ft` of its RayCluster, given the head's URL once
    reached); NotFound when its RayCluster does not exist."""
    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    name = kube_raycluster(cfg)
    if progress:
        progress(f"reading RayCluster {cfg.namespace}/{name} and its pods")
    rc = kube.RayClusters(api).get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}",
                       hint="pass the cluster name (doctor CLUSTER) and --namespace, or create it with 'miles-ray up'")
    pods = kube.list_pods(api, cfg.namespace, kube.cluster_selector(name))
    findings = [
        check_pending(api, cfg, pods),
        check_container_failures(pods),
        check_shm(rc),
        check_gpu_visibility(rc),
        check_external_ray(api, cfg, rc, name),
        check_image_drift(rc, pods, cfg),
    ]
    return findings, kube.pod_rows(pods), functools.partial(check_gcs_ft, rc)


STALE_NODE_FIX = ("a pod deleted a moment ago stays ALIVE in Ray until the head's health check fails (about 30 s "
                  "by default): run doctor again; if it stays, a raylet outside this RayCluster joined its head")
NOT_JOINED_FIX = ("its raylet did not join the head: 'kubectl logs POD -c ray' shows why; check that "
                  "the pod reaches the head Service's GCS port 6379 (NetworkPolicy) and runs the head's Ray version")


def check_ray_membership(pods: list[dict], topology: dict) -> Finding:
    """Every Ready pod of the RayCluster (``kube.cluster_pods``) against Ray's ALIVE nodes
    (``ray_jobs.cluster_topology``), matched by IP: a Ready pod Ray does not list is a problem (its raylet never
    joined, or left); an ALIVE node no pod of the cluster has is a warning (a pod deleted a moment ago)."""
    alive = {n["ip"]: n for n in topology.get("nodes", []) if n.get("ip")}
    pod_ips = {p["ip"] for p in pods if p.get("ip")}
    ready = [p for p in pods if p["ready"] and not p["deleting"] and p.get("ip")]
    evidence, missing = [], []
    for p in ready:
        n = alive.get(p["ip"])
        if n is None:
            missing.append(p)
            evidence.append(f"{p['name']} ({p['role']}, {p['ip']}): Ready, not a node of Ray")
        else:
            evidence.append(f"{p['name']} ({p['role']}, {p['ip']}): ALIVE in Ray, {n['gpus']:g} GPUs")
    stale = sorted(ip for ip in alive if ip not in pod_ips)
    evidence += [f"{ip}: ALIVE in Ray ({alive[ip]['gpus']:g} GPUs), no pod of this RayCluster has this IP"
                 for ip in stale]
    if missing:
        return finding("ray_membership", "startup", PROBLEM,
                       f"{len(missing)} Ready pod(s) not in Ray: " + ", ".join(p["name"] for p in missing), evidence,
                       NOT_JOINED_FIX)
    if stale:
        return finding("ray_membership", "startup", WARNING,
                       f"Ray lists {len(stale)} ALIVE node(s) that no pod has: {', '.join(stale)}", evidence,
                       STALE_NODE_FIX)
    if not ready:
        return finding("ray_membership", "startup", SKIPPED, "no Ready pod to compare with Ray's nodes", evidence)
    workers = sum(1 for p in ready if p["role"] == "worker")
    return finding("ray_membership", "startup", OK,
                   f"every Ready pod is ALIVE in Ray ({len(ready) - workers} head, {workers} worker(s))", evidence)


GCS_FT_FIX = ("for a run of hours, bring the cluster up with GCS fault tolerance: 'miles-ray up --via kuberay --gcs-ft "
              "redis://HOST:PORT --gcs-ft-password-secret NAME[:KEY]' (a live cluster is not changed in place: 'down' "
              "first, when no run needs it; checkpoints stay). Polyaxon 2.18's raycluster cannot carry it")


def check_gcs_ft(rc: dict, url: str | None, unreached: str | None) -> Finding:
    """Whether the head's loss would take the workers with it, and whether that matters now. A LONG run here is a
    miles-ray training job (direct or launcher mode: Miles runs of hours; rehearsals are minutes) that the head
    lists PENDING or RUNNING: without ``spec.gcsFaultToleranceOptions`` losing the head pod restarts every worker
    and kills that job (a warning); with it (or with nothing long running) ok."""
    options = (rc.get("spec") or {}).get("gcsFaultToleranceOptions") or {}
    name = (rc.get("metadata") or {}).get("name", "?")
    if options.get("redisAddress"):
        return finding("gcs_ft", "resume", OK, f"RayCluster {name} has GCS fault tolerance (Redis "
                       f"{options['redisAddress']}): losing its head pod does not restart the workers",
                       [f"spec.gcsFaultToleranceOptions.redisAddress: {options['redisAddress']}"])
    evidence = [f"RayCluster {name}: no spec.gcsFaultToleranceOptions (the head's GCS state lives only in the head "
                "pod: losing it restarts every worker's raylet and kills every job)"]
    if url is None:
        return finding("gcs_ft", "resume", SKIPPED, f"RayCluster {name} has no GCS fault tolerance; whether a long "
                       "run is on it is unknown (the Ray head does not answer)",
                       evidence + ([unreached] if unreached else []), GCS_FT_FIX)
    try:
        jobs = ray_jobs.list_jobs(url)
    except ClusterError as e:
        return finding("gcs_ft", "resume", SKIPPED, f"RayCluster {name} has no GCS fault tolerance; its jobs could "
                       f"not be read: {e}", evidence, GCS_FT_FIX)
    long_runs = [j for j in jobs if j.get("status") in ("PENDING", "RUNNING")
                 and (j.get("metadata") or {}).get("mode") in ("direct", "launcher")]
    if not long_runs:
        return finding("gcs_ft", "resume", OK, f"no training run is running on RayCluster {name} (it has no GCS "
                       "fault tolerance: a long run there would be lost with its head pod)", evidence, GCS_FT_FIX)
    runs = ", ".join(sorted({(j.get("metadata") or {}).get("miles_ray_run") or j.get("job_id") or "?"
                             for j in long_runs}))
    evidence += [f"job {j.get('job_id')} of run {(j.get('metadata') or {}).get('miles_ray_run')}: {j.get('status')} "
                 f"({(j.get('metadata') or {}).get('mode')} mode)" for j in long_runs[:8]]
    return finding("gcs_ft", "resume", WARNING, f"training run(s) {runs} run on RayCluster {name}, which has no GCS "
                   "fault tolerance: losing its head pod would restart every worker and kill the run's job", evidence,
                   GCS_FT_FIX)


def ray_membership(pods: list[dict], url: str | None, unreached: str | None) -> Finding:
    """``check_ray_membership`` on the RayCluster's pods (``kube_findings``' second value) and the head at ``url``
    (None: not reached)."""
    if url is None:
        return finding("ray_membership", "startup", SKIPPED, "the Ray head does not answer: Ray's nodes are unknown",
                       [unreached] if unreached else [], "'miles-ray status' shows the head pod")
    try:
        topology = ray_jobs.cluster_topology(url)
    except ClusterError as e:
        return finding("ray_membership", "startup", SKIPPED, f"Ray's nodes could not be read: {e}", [])
    return check_ray_membership(pods, topology)
