"""miles-ray doctor: the seed's troubleshooting list, automated. Each finding names the seed item it
answers, what was looked at (evidence) and what to do (fix).

Seed items (docs/troubleshooting.md maps them one by one):
  pending      "The pod stays Pending"            -> pods_pending
  data         "cannot find a checkpoint/dataset" -> data (check-data's checks, where a head is reachable)
  startup      "Ray or NCCL fails during startup" -> container_failures, shm, gpu_visibility, external_ray
  resume       "Training restarts from scratch"   -> resume (run record + checkpoint tracker)
  drift        "keep image and Ray version aligned across replicas" -> image_drift, ray_version

Kubernetes (KubeRay or Polyaxon-created RayClusters): everything. Local backend and plain --address:
the Ray-side subset (nodes alive, Ray version, data, resume).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError

Progress = Callable[[str], None] | None
GPU = "nvidia.com/gpu"
PROBLEM, WARNING, OK, SKIPPED = "problem", "warning", "ok", "skipped"
SEED = {
    "pending": "The pod stays Pending",
    "data": "The launcher cannot find a checkpoint or dataset",
    "startup": "Ray or NCCL fails during startup",
    "resume": "Training restarts from scratch",
    "drift": "Keep the container image and Ray version aligned across replicas",
}


def finding(check: str, seed: str, status: str, summary: str, evidence: list[str] | None = None,
            fix: str = "") -> dict[str, Any]:
    return {"check": check, "seed": SEED[seed], "status": status, "summary": summary,
            "evidence": list(evidence or []), "fix": fix}


def _say(progress: Progress, msg: str) -> None:
    if progress:
        progress(msg)


# -- Kubernetes reads (raw pod/quota/service objects; miles_ray.adapters.kube has the cluster-level calls) --

def _core(api):
    from kubernetes import client

    return client.CoreV1Api(api)


def _raw_pods(api, namespace: str, cluster: str) -> list[Any]:
    from miles_ray.adapters.kube import api_error

    try:
        return _core(api).list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={cluster}").items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list pods of {cluster}") from None


def _quotas(api, namespace: str) -> list[Any]:
    try:
        return _core(api).list_namespaced_resource_quota(namespace).items
    except Exception:  # noqa: BLE001 - quotas are evidence, not a requirement (RBAC may hide them)
        return []


def _service_ports(api, namespace: str, name: str) -> list[int] | None:
    try:
        svc = _core(api).read_namespaced_service(name, namespace)
    except Exception:  # noqa: BLE001
        return None
    return [p.port for p in (svc.spec.ports or [])]


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
    from miles_ray.adapters.kube import quantity

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

def check_pending(api, cfg: MilesRayConfig, pods: list[Any]) -> dict[str, Any]:
    from miles_ray.adapters.kube import gpu_capacity

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
    for q in _quotas(api, cfg.namespace):
        hard, used = (q.status.hard or {}), (q.status.used or {})
        for k in hard:
            if "gpu" in k or k in ("requests.cpu", "requests.memory", "limits.memory", "pods"):
                evidence.append(f"ResourceQuota {q.metadata.name}: {k} used {used.get(k, '0')} of {hard[k]}")
                from miles_ray.adapters.kube import quantity

                if quantity(used.get(k, 0)) >= quantity(hard[k]):
                    fixes.append(f"ResourceQuota {q.metadata.name} is exhausted for {k}: raise it or free quota")
    if not fixes:
        fixes.append("inspect the scheduler message above (queue capacity, affinity, volumes)")
    return finding("pods_pending", "pending", PROBLEM,
                   f"{len(pending)} pod(s) stay Pending: " + ", ".join(p.metadata.name for p in pending[:5]),
                   evidence, "; ".join(dict.fromkeys(fixes)))


def check_container_failures(pods: list[Any]) -> dict[str, Any]:
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


def check_shm(rc: dict) -> dict[str, Any]:
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


def check_gpu_visibility(rc: dict) -> dict[str, Any]:
    from miles_ray.adapters.kube import quantity

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


def check_external_ray(api, cfg: MilesRayConfig, rc: dict, name: str) -> dict[str, Any]:
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
    ports = _service_ports(api, cfg.namespace, svc)
    if ports is None:
        bad.append(f"head service {cfg.namespace}/{svc} does not exist")
    else:
        evidence.append(f"head address http://{svc}.{cfg.namespace}.svc:8265 (service ports {ports})")
        if 8265 not in ports:
            bad.append(f"head service {svc} does not expose the dashboard port 8265 (ports {ports})")
    fix = ("submit with RAY_ADDRESS=http://<cluster>-head-svc.<ns>.svc:8265 and MILES_SCRIPT_EXTERNAL_RAY=1 "
           "(miles-ray submit sets both); without it the launcher runs 'ray stop' and starts a second cluster")
    if bad:
        return finding("external_ray", "startup", PROBLEM, "; ".join(bad), evidence, fix)
    if warn:
        return finding("external_ray", "startup", WARNING,
                       f"MILES_SCRIPT_EXTERNAL_RAY is not set in {', '.join(warn)}", evidence, fix)
    return finding("external_ray", "startup", OK, "external-Ray setting and head address are consistent", evidence)


def check_image_drift(rc: dict, pods: list[Any], cfg: MilesRayConfig) -> dict[str, Any]:
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


# -- checks: Ray side (local, address, or a reachable KubeRay head) --------------------------------

def check_ray_version(address: str, cfg: MilesRayConfig, expected: str | None) -> dict[str, Any]:
    from miles_ray.adapters import ray_jobs

    live = ray_jobs.ray_version(address)
    want = expected or cfg.ray_version
    ev = [f"head {address} runs Ray {live or 'unknown'}", f"expected {want or '(not configured)'}"]
    if live and want and live != want:
        return finding("ray_version", "drift", PROBLEM, f"the head runs Ray {live}, expected {want}", ev,
                       "head, workers and submitter must run one Ray version: fix --ray-version or the image")
    return finding("ray_version", "drift", OK, f"Ray {live or 'unknown'} on the head", ev)


def check_local_nodes(st: dict) -> dict[str, Any]:
    ev = [f"{n['ip']}: {'head' if n['is_head'] else 'gpu worker'} {n['state']}, {n['gpus']:g} GPUs" +
          ("" if n.get("process_alive", True) else " (process gone)") for n in st["nodes"]]
    ev += [f"{n['ip']}: {n['state']}" for n in st.get("dead_nodes", [])]
    gone = [n for n in st["nodes"] if n.get("process_alive") is False]
    if st.get("dead_count") or gone:
        return finding("container_failures", "startup", PROBLEM,
                       f"{st.get('dead_count', 0)} dead node(s), {len(gone)} worker process(es) gone", ev,
                       "'miles-ray down --backend local' and 'up' again; the raylet logs are under the temp dir "
                       f"{st.get('temp_dir')}")
    return finding("container_failures", "startup", OK, f"{st['alive_count']} node(s) alive, "
                   f"{st['gpu_node_count']} GPU worker(s)", ev)


def check_data_and_resume(cfg: MilesRayConfig, address: str | None, record: dict | None, timeout: float,
                          python: str | None, progress: Progress) -> list[dict[str, Any]]:
    from miles_ray.core.recipes import get_recipe
    from miles_ray.services.datacheck import check_data

    findings = []
    resume_dir = None
    if record is not None:
        rev, problems = [f"run {record['run']} output dir {record['output_dir']}"], []
        if record.get("resumed_from"):
            rev.append(f"resumed from run {record['resumed_from']}")
            from miles_ray.adapters import state

            prev = state.read_json(state.record_path(record["resumed_from"]))
            if prev is None:
                problems.append(f"the run it resumes from ({record['resumed_from']}) has no record here")
            else:
                rev.append(f"{record['resumed_from']} wrote to {prev['output_dir']}")
                if prev["output_dir"].rstrip("/") != record["output_dir"].rstrip("/"):
                    problems.append(f"it writes to {record['output_dir']}, not to {prev['output_dir']} where the "
                                    "previous checkpoints are")
            resume_dir = record["output_dir"]
        load = f"--load {record['output_dir']}/checkpoints"
        if record.get("mode") == "direct" and load not in record.get("entrypoint", ""):
            problems.append(f"its entrypoint lacks '{load}': Miles will not load the checkpoints")
        if not record.get("resumed_from"):
            findings.append(finding("resume", "resume", OK, f"run {record['run']} is a fresh run (no --resume-from); "
                                    f"to continue it later: --resume-from {record['run']}", rev))
        elif problems:
            findings.append(finding("resume", "resume", PROBLEM, "; ".join(problems), rev,
                                    f"resubmit with --resume-from {record['resumed_from']} so the run reuses its "
                                    "output dir (a new output dir starts from scratch)"))
        else:
            findings.append(finding("resume", "resume", OK, "the run points at the previous output dir", rev))
    if not address:
        findings.append(finding("data", "data", SKIPPED, "no reachable Ray head to run the data checks from",
                                [], "port-forward the head (kubectl port-forward svc/<cluster>-head-svc 8265) and "
                                    "pass --address http://127.0.0.1:8265, or run 'miles-ray check-data' there"))
        return findings
    recipe = get_recipe(record["recipe"] if record else cfg.recipe, cfg.recipe_file)
    _say(progress, f"running check-data on {address}")
    try:
        rep = check_data(cfg, address, recipe, resume_dir, timeout=timeout, python=python)
    except ClusterError as e:
        findings.append(finding("data", "data", SKIPPED, f"the data checks could not run: {e}", [],
                                "check the head with 'miles-ray status'"))
        return findings
    tracker = [m for m in rep["missing"] if "latest_checkpointed_iteration.txt" in m]
    data = [m for m in rep["missing"] if m not in tracker]
    ev = [f"{len(rep['nodes'])} node(s) checked by job {rep['job']}"]
    if data:
        findings.append(finding("data", "data", PROBLEM, f"{len(data)} missing or unusable path(s) across the nodes",
                                ev + data, f"prepare the model and data on the volume at {cfg.mount_path} (the seed's "
                                           "layout) and mount it at the same path on the head and every worker"))
    else:
        findings.append(finding("data", "data", OK, "every node sees the model, data and shared output storage",
                                ev))
    if resume_dir:
        if tracker:
            findings.append(finding("resume_tracker", "resume", PROBLEM,
                                    f"no checkpoint tracker in {resume_dir}/checkpoints: training restarts from "
                                    "scratch", tracker, "point --resume-from at the run whose output dir holds the "
                                                        "checkpoints, or wait for its first save (every 20 rollouts)"))
        else:
            its = sorted({c.get("iteration") for n in rep["nodes"] for c in n.get("checks", [])
                          if c["what"] == "resume checkpoint tracker" and c.get("iteration")})
            findings.append(finding("resume_tracker", "resume", OK, f"checkpoint tracker present (iteration "
                                    f"{', '.join(its) or '?'})", [f"{resume_dir}/checkpoints"]))
    return findings


# -- orchestration -------------------------------------------------------------------------------

def doctor(cfg: MilesRayConfig, target: str | None = None, backend: str = "auto", address: str | None = None,
           timeout: float = 60, python: str | None = None, progress: Progress = None) -> dict[str, Any]:
    """Diagnose a cluster (by name) or a run (by run name). Returns findings; never raises for a finding."""
    from miles_ray.adapters import state

    record = state.read_json(state.record_path(target)) if target and re.match(r"^[a-z0-9-]+$", target) else None
    kind = "run" if record else "cluster"
    if record:
        cfg = cfg.model_copy(update={"name": record["cluster"], "kube_context": record.get("kube_context")
                                     or cfg.kube_context})
        backend = {"local": "local", "kuberay": "kubernetes", "polyaxon": "kubernetes"}.get(record["backend"],
                                                                                              "address")
        if backend != "kubernetes":  # a KubeRay head's service URL answers only inside the cluster
            address = address or record["address"]
    elif target:
        from pydantic import ValidationError

        from miles_ray.core.config import MilesRayConfig as _Cfg
        from miles_ray.core.errors import ConfigError

        try:
            cfg = _Cfg.model_validate({**cfg.model_dump(), "name": target})
        except ValidationError as e:
            raise ConfigError(f"doctor {target}: not a run of this machine, and not a valid cluster name "
                              f"({str(e.errors()[0]['msg']).removeprefix('Value error, ')})",
                              hint="'miles-ray runs' lists runs; cluster names are DNS-1035 labels") from None
    findings: list[dict[str, Any]] = []
    out: dict[str, Any] = {"target": target or cfg.name, "kind": kind, "cluster": cfg.name}
    if backend == "auto":
        from miles_ray.services.clusters import pick_backend

        backend = "address" if address and not record else pick_backend("auto", cfg)
    out["backend"] = backend
    expected_ray = record.get("ray_version") if record else None

    if backend == "kubernetes":
        findings += _kube_findings(cfg, progress)
    elif backend == "local":
        from miles_ray.adapters import local_ray
        from miles_ray.services.clusters import local_state_dir

        try:
            st = local_ray.status(local_state_dir(), cfg.name)
            findings.append(check_local_nodes(st))
            address = address or st["dashboard_url"]
        except ClusterError as e:
            findings.append(finding("container_failures", "startup", PROBLEM, str(e), [],
                                    e.hint or "'miles-ray up --backend local'"))
    if address:
        out["address"] = address
        try:
            findings.append(check_ray_version(address, cfg, expected_ray))
        except ClusterError as e:
            findings.append(finding("ray_version", "drift", PROBLEM, f"the Ray head does not answer: {e}", [],
                                    "'miles-ray status' shows why; a recreated head needs its workers to rejoin"))
            address = None
    findings += check_data_and_resume(cfg, address, record, timeout, python, progress)
    out["findings"] = findings
    out["problems"] = sum(1 for f in findings if f["status"] == PROBLEM)
    out["warnings"] = sum(1 for f in findings if f["status"] == WARNING)
    return out


def _kube_findings(cfg: MilesRayConfig, progress: Progress) -> list[dict[str, Any]]:
    from miles_ray.adapters import kube
    from miles_ray.services.kube import cluster_record

    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    name = cluster_record(cfg)["raycluster"]
    _say(progress, f"reading RayCluster {cfg.namespace}/{name} and its pods")
    rc = kube.RayClusters(api).get(cfg.namespace, name)
    if rc is None:
        raise ClusterError(f"no RayCluster {cfg.namespace}/{name}",
                           hint="pass the cluster name (doctor CLUSTER) and --namespace, or create it with 'miles-ray up'")
    pods = _raw_pods(api, cfg.namespace, name)
    return [
        check_pending(api, cfg, pods),
        check_container_failures(pods),
        check_shm(rc),
        check_gpu_visibility(rc),
        check_external_ray(api, cfg, rc, name),
        check_image_drift(rc, pods, cfg),
    ]
