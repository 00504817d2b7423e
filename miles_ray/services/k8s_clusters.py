"""Clusters on Kubernetes: preflight, create (KubeRay directly or a Polyaxon raycluster operation), wait until
the GPU workers joined Ray, scale, status, down; and the single-node Polyaxon job.

Each verb first prepares, purely, the exact objects it will create (:func:`miles_ray.core.plans.prepare_cluster`,
validated), then reads the cluster (preflight) and only then creates or changes anything."""

from __future__ import annotations

import time
from typing import Any

from miles_ray.adapters import kube, polyaxon_api, polyaxon_spec, ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.builders import RAY_TOKEN_KEY, kuberay_token_secret, ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.crd_fields import first_unknown_field, kuberay_version_needed
from miles_ray.core.errors import (ClusterError, ConfigError, Conflict, Interrupted, Invalid, NotFound, TimedOut,
                                   Unreachable)
from miles_ray.core.heads import k8s_address
from miles_ray.core.plans import ClusterObjects, prepare_cluster
from miles_ray.core.queues import kueue_pending_reason, kueue_queue_of, kueue_queued
from miles_ray.services.jobs import live_status
from miles_ray.services.queues import check_queue
from miles_ray.core.progress import Progress, say as _say

POLL = 1.0
UNSCHEDULABLE_POLLS = 2  # an Unschedulable condition seen on this many polls in a row fails the wait


# -- where a cluster's bookkeeping lives ----------------------------------------------------------

def cluster_record(cfg: MilesRayConfig) -> dict[str, Any]:
    """Which RayCluster the configured name is (and the Polyaxon run behind it), as 'up' recorded it."""
    return state.read_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)


def _save_record(cfg: MilesRayConfig, record: dict[str, Any]) -> None:
    """Also records the cluster's Ray auth, which a later submit (launcher job) must match: the mode and the
    Secret holding the token (the one the operation references, or KubeRay's, named after the RayCluster)."""
    if cfg.ray_auth == "token":
        secret = ray_token_secret(cfg) if record.get("via") == "polyaxon" else (
            cfg.ray_auth_secret or kuberay_token_secret(record["raycluster"]))
    else:
        secret = None
    state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name,
                             {**record, "ray_auth": cfg.ray_auth, "ray_token_secret": secret})


def _client(cfg: MilesRayConfig):
    return kube.load_client(cfg.kubeconfig, cfg.kube_context)


def without_kubectl(cfg: MilesRayConfig, rec: dict[str, Any] | None = None) -> str | None:
    """For a cluster made through Polyaxon (or about to be, ``rec`` None): the kubeconfig path that does not
    exist when there is no Kubernetes access at all (a Polyaxon user without kubectl), else None. An
    explicit --kubeconfig/config ``kubeconfig`` that does not exist stays an error (``_client`` says so)."""
    if cfg.kubeconfig or (rec is not None and not rec.get("polyaxon_uuid")):
        return None
    return kube.missing_kubeconfig(None)


def _polyaxon(cfg: MilesRayConfig, rec: dict[str, Any] | None = None):
    """(client, owner, project) of the cluster's Polyaxon run (as 'up' recorded it) or of the config."""
    rec = rec or {}
    return (polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host), rec.get("polyaxon_owner") or cfg.polyaxon_owner,
            rec.get("polyaxon_project") or cfg.polyaxon_project)


# -- preflight ------------------------------------------------------------------------------------

def create_token_secret_hint(namespace: str, secret: str) -> str:
    return (f"create it once: kubectl -n {namespace} create secret generic {secret} "
            f"--from-literal={RAY_TOKEN_KEY}=$(openssl rand -hex 32) (on the Polyaxon path nobody else creates it: "
            "Polyaxon's RayCluster has no authOptions, so KubeRay makes none); or set ray_auth_secret to an "
            "existing Secret with that key")


def check_token_secret(cfg: MilesRayConfig, api_client, secret: str, who: str) -> str:
    """Refuse, before anything is created, a Ray token Secret that ``who`` (the pods of an operation or job that
    read ``RAY_AUTH_TOKEN`` from it by secretKeyRef) could not start with: missing (their containers would stay
    in CreateContainerConfigError) or without the key ``auth_token``. Returns ``namespace/secret``."""
    has = kube.secret_has_key(api_client, cfg.namespace, secret, RAY_TOKEN_KEY)
    where = f"{cfg.namespace}/{secret}"
    if has is None:
        raise NotFound(f"the Ray token Secret {where} does not exist: {who} read RAY_AUTH_TOKEN from it (key "
                       f"{RAY_TOKEN_KEY}), so their containers could not start (CreateContainerConfigError); "
                       "nothing was created", hint=create_token_secret_hint(cfg.namespace, secret))
    if not has:
        raise ClusterError(f"the Ray token Secret {where} has no key {RAY_TOKEN_KEY} (or it is empty): {who} read "
                           f"RAY_AUTH_TOKEN from that key; nothing was created",
                           hint=create_token_secret_hint(cfg.namespace, secret))
    return where


def unchecked_token_secret(cfg: MilesRayConfig, secret: str) -> str:
    """What a notice says when there is no kubeconfig to check the token Secret with."""
    return (f"the Ray token Secret {cfg.namespace}/{secret} (key {RAY_TOKEN_KEY}; pods without it stay in "
            "CreateContainerConfigError)")


def check_fields_known(rendered: dict, schema: dict | None) -> None:
    """Refuse (exit 2) the first field of the rendered RayCluster that the installed CRD's schema does not
    declare: the API server would silently drop it (e.g. ``spec.authOptions`` on KubeRay < v1.5.1 -- the
    cluster would then come up without token authentication)."""
    if not schema:
        return  # a CRD without a structural schema prunes nothing
    unknown = first_unknown_field(rendered, schema)
    if unknown is None:
        return
    path, value = unknown
    raise Invalid(f"the KubeRay operator installed on this cluster does not know RayCluster field {path} "
                  f"(its CRD has no such field; the API server would drop it); it needs KubeRay >= "
                  f"{kuberay_version_needed(path, value)}",
                  hint="upgrade the KubeRay operator and its CRDs, or change the setting that renders it")


def preflight(cfg: MilesRayConfig, api_client, nodes: int, via: str, reconciling: bool = False,
              rendered: dict | None = None) -> dict[str, Any]:
    """Everything that must hold before anything is created. Raises a typed error saying what fails.
    ``rendered``: the RayCluster that will be created, checked field by field against the installed CRD."""
    report: dict[str, Any] = {}
    if not kube.namespace_exists(api_client, cfg.namespace):
        raise NotFound(f"namespace {cfg.namespace!r} does not exist",
                       hint=f"create it (kubectl create namespace {cfg.namespace}) or pass --namespace")
    crd = kube.raycluster_crd(api_client)
    if crd is None:
        raise NotFound("the KubeRay RayCluster CRD (rayclusters.ray.io) is not installed on this cluster",
                       hint="install the KubeRay operator (its Helm chart installs the CRDs)")
    versions = kube.crd_served_versions(crd)
    if "v1" not in versions:
        raise ClusterError(f"the installed KubeRay serves RayCluster versions {versions}, not v1",
                           hint="upgrade KubeRay to >= 1.0")
    report["crd_versions"] = versions
    queue = check_queue(cfg, api_client)
    if queue is not None:
        report["queue"] = queue
    if rendered is not None:
        check_fields_known(rendered, kube.crd_schema(crd))
    if via == "kuberay" and not kube.pvc_exists(api_client, cfg.namespace, cfg.claim):
        raise NotFound(f"PersistentVolumeClaim {cfg.namespace}/{cfg.claim} does not exist",
                       hint="create the shared volume for models, data and checkpoints, or set volume_claim")
    if not reconciling:
        cap = kube.gpu_capacity(api_client, cfg.node_selector,
                                [t.model_dump(exclude_none=True) for t in cfg.tolerations])
        cpu = cfg.worker_cpu_request
        mem = kube.quantity(cfg.memory_per_node)
        fitting = cap.fitting(cfg.gpus_per_node, cpu, mem)
        report["gpu_nodes"] = len(cap.nodes)
        report["gpu_nodes_fitting"] = len(fitting)
        if len(fitting) < nodes:
            eligible = [n for n in cap.nodes if n.eligible]
            busy = [n for n in eligible if n not in fitting]
            excluded = [n for n in cap.nodes if not n.eligible]
            detail = [f"{len(cap.nodes)} node(s) have {kube.GPU}",
                      f"{len(eligible)} match the node selector and tolerations",
                      f"{len(fitting)} have {cfg.gpus_per_node} GPUs, {cpu:g} CPUs and "
                      f"{cfg.memory_per_node} free"]
            if busy:
                detail.append("too full: " + ", ".join(
                    f"{n.name} ({n.gpus_free:g} GPUs, {n.cpu_free:g} CPUs, {n.memory_free / 2**30:.1f}Gi free)"
                    for n in busy[:5]))
            if excluded:
                detail.append("excluded: " + ", ".join(f"{n.name} ({n.why_not})" for n in excluded[:5]))
            raise ClusterError(f"not enough GPU nodes: need {nodes} with {cfg.gpus_per_node} free {kube.GPU} each; "
                               + "; ".join(detail),
                               hint="use fewer --nodes, free GPUs, fix node_selector/tolerations, or ask less per "
                                    "pod (memory_per_node, cpu_request_per_node)")
    return report


# -- up -------------------------------------------------------------------------------------------

def up(cfg: MilesRayConfig, progress: Progress = None, timeout: float = 600, via: str = "kuberay",
       dry_run: str | None = None, wait: bool = True, ray_check: bool = True) -> dict[str, Any]:
    try:
        return _up(cfg, progress, timeout, via, dry_run, wait, ray_check)
    except KeyboardInterrupt:
        # Ctrl-C / SIGINT: say what may be left and how to resume (up is idempotent by name)
        raise Interrupted(f"interrupted while bringing up {cfg.name} in {cfg.namespace}; whatever was created is "
                          "left in place", hint="run the same 'miles-ray up' again to resume (it never creates a "
                                                "second cluster), or 'miles-ray down' to remove it") from None


def _up(cfg: MilesRayConfig, progress: Progress, timeout: float, via: str, dry_run: str | None, wait: bool,
        ray_check: bool) -> dict[str, Any]:
    objects = prepare_cluster(cfg, via)  # everything that will be created, before any I/O
    if objects.operation is not None:
        polyaxon_spec.validate_operation(objects.operation)
    rc = objects.raycluster
    if via == "polyaxon":
        missing = without_kubectl(cfg)
        if missing:
            token = (f", {unchecked_token_secret(cfg, ray_token_secret(cfg))}" if cfg.ray_auth == "token" else "")
            notice = (f"no kubeconfig ({missing} does not exist): the Kubernetes preflight (namespace, KubeRay CRD, "
                      f"{cfg.nodes} free GPU node(s) x {cfg.gpus_per_node}{token}) is skipped; Polyaxon's agent "
                      "schedules the operation")
            result = {"name": cfg.name, "namespace": cfg.namespace, "via": via, "warnings": objects.warnings,
                      "preflight": {"skipped": "no kubeconfig"}, "notices": [notice], "kubernetes": False}
            return _up_polyaxon(cfg, None, objects, result, progress, timeout, dry_run, wait, ray_check)
    api = _client(cfg)
    rays = kube.RayClusters(api)
    existing = rays.get(cfg.namespace, cfg.name) if via == "kuberay" else None
    _say(progress, f"preflight: namespace {cfg.namespace}, KubeRay CRD, {cfg.nodes} GPU node(s) x {cfg.gpus_per_node}")
    report = preflight(cfg, api, cfg.nodes, via, reconciling=existing is not None,
                       rendered=rc if via == "kuberay" else None)
    if via == "polyaxon" and cfg.ray_auth == "token":
        _say(progress, f"preflight: the Ray token Secret {cfg.namespace}/{ray_token_secret(cfg)}")
        report["ray_token_secret"] = check_token_secret(cfg, api, ray_token_secret(cfg),
                                                        "the operation's head and workers")
    result: dict[str, Any] = {"name": cfg.name, "namespace": cfg.namespace, "via": via, "preflight": report,
                              "warnings": objects.warnings}
    if via == "polyaxon":
        return _up_polyaxon(cfg, api, objects, result, progress, timeout, dry_run, wait, ray_check)
    if dry_run == "client":  # preflight only: nothing sent to the API server
        result.update({"dry_run": "client", "created": False, "raycluster": rc})
        return result
    if dry_run == "server":
        rays.create(rc, dry_run=True)
        result.update({"dry_run": "server", "created": False, "raycluster": rc})
        return result
    if existing is not None:
        diffs = _drift(existing, rc)
        if diffs:
            raise Conflict(f"RayCluster {cfg.namespace}/{cfg.name} already exists and differs: " + "; ".join(diffs),
                           hint="'miles-ray scale' changes the size; 'miles-ray down' then 'up' changes the image")
        _say(progress, f"RayCluster {cfg.name} already exists with this spec; waiting for it")
        result["created"] = False
    else:
        try:
            rays.create(rc)
            result["created"] = True
            _say(progress, f"created RayCluster {cfg.namespace}/{cfg.name}")
        except Conflict:
            result["created"] = False
            # another 'up' of the same name won the race: reconcile with what it created
            raced = rays.get(cfg.namespace, cfg.name)
            diffs = _drift(raced, rc) if raced is not None else []
            if diffs:
                raise Conflict(f"RayCluster {cfg.namespace}/{cfg.name} was just created by someone else and "
                               "differs: " + "; ".join(diffs), hint="'miles-ray status' shows it") from None
            _say(progress, f"RayCluster {cfg.name} already exists (created by a concurrent 'up' meanwhile); "
                           "waiting for it")
    _save_record(cfg, {"name": cfg.name, "via": "kuberay", "raycluster": cfg.name, "namespace": cfg.namespace,
                       "context": cfg.kube_context})
    if wait:
        result["status"] = wait_ready(cfg, api, cfg.name, cfg.nodes, progress, timeout, ray_check)
    return result


def _drift(existing: dict, wanted: dict) -> list[str]:
    diffs = []
    es, ws = existing.get("spec", {}), wanted["spec"]
    if es.get("rayVersion") != ws["rayVersion"]:
        diffs.append(f"rayVersion {es.get('rayVersion')} != {ws['rayVersion']}")

    def image(spec: dict, path: str) -> str | None:
        try:
            if path == "head":
                return spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
            return spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"]
        except (KeyError, IndexError):
            return None

    for part in ("head", "worker"):
        if image(es, part) != image(ws, part):
            diffs.append(f"{part} image {image(es, part)} != {image(ws, part)}")
    eg = (es.get("workerGroupSpecs") or [{}])[0]
    wg = ws["workerGroupSpecs"][0]
    if eg.get("replicas") != wg["replicas"]:
        diffs.append(f"replicas {eg.get('replicas')} != {wg['replicas']}")
    return diffs


def polyaxon_preflight(cfg: MilesRayConfig, op: dict, progress: Progress = None):
    """Before creating an operation: the project exists, and (when the agent's connections are known) every
    connection the operation names is one the agent has. Returns (client, known connections or None)."""
    client = polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host)
    _say(progress, f"checking Polyaxon project {cfg.polyaxon_owner}/{cfg.polyaxon_project} at {client.host}")
    client.check_project(cfg.polyaxon_owner, cfg.polyaxon_project)
    known = polyaxon_api.list_agent_connections()
    if known is not None:
        missing = sorted(set(polyaxon_spec.connection_names(op)) - set(known))
        if missing:
            raise NotFound(f"the Polyaxon agent does not know connection(s) {', '.join(missing)} "
                           f"(known: {', '.join(sorted(known)) or 'none'})",
                           hint="register the connection in the agent config, or set 'connection'")
    return client, known


def up_single_node(cfg: MilesRayConfig, op: dict, warnings: list[str], dry_run: str | None, wait: bool,
                   timeout: float, progress: Progress = None) -> dict[str, Any]:
    """Create the single-node job (one pod running the upstream launcher, to confirm one complete run before
    going multi-node; built and validated by the caller) through the Polyaxon API, idempotent by name and
    content."""
    notices: list[str] = []
    if cfg.ray_auth == "token":  # the job's container reads RAY_AUTH_TOKEN from the Secret (see single_node)
        missing = without_kubectl(cfg)
        if missing:
            notices.append(f"no kubeconfig ({missing} does not exist): "
                           f"{unchecked_token_secret(cfg, ray_token_secret(cfg))} is not checked")
        else:
            _say(progress, f"preflight: the Ray token Secret {cfg.namespace}/{ray_token_secret(cfg)}")
            check_token_secret(cfg, _client(cfg), ray_token_secret(cfg), "the single-node job's container")
    client, known = polyaxon_preflight(cfg, op, progress)
    result: dict[str, Any] = {"name": cfg.name, "kind": "single-node",
                              "project": f"{cfg.polyaxon_owner}/{cfg.polyaxon_project}", "warnings": warnings,
                              "notices": notices}
    if dry_run:
        result.update({"dry_run": dry_run, "created": False, "operation": op})
        return result
    meta = {"miles_ray": {"recipe": cfg.recipe, "kind": "single-node", "gpus_per_node": cfg.gpus_per_node,
                          "image": cfg.image}}
    uuid = client.create_operation(cfg.polyaxon_owner, cfg.polyaxon_project, op, name=cfg.name,
                                   tags=op.get("tags"), meta=meta, known_connections=known)
    _say(progress, f"created Polyaxon run {uuid}")
    result.update({"created": True, "polyaxon_uuid": uuid,
                   "output_dir": f"{cfg.mount_path}/{cfg.runs_dir}/{uuid}"})
    if wait:
        _say(progress, f"waiting up to {timeout:.0f}s for run {uuid} to start (Polyaxon's agent schedules the pod)")
        run = client.wait_for_status(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, {"running", "succeeded"}, timeout)
    else:
        run = client.get_run(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, with_conditions=False)
    result["status"] = run.get("status")
    return result


def _up_polyaxon(cfg: MilesRayConfig, api, objects: ClusterObjects, result: dict[str, Any], progress: Progress,
                 timeout: float, dry_run: str | None, wait: bool, ray_check: bool) -> dict[str, Any]:
    op, plan = objects.operation or {}, objects.plan
    client, known = polyaxon_preflight(cfg, op, progress)
    if dry_run:
        result.update({"dry_run": dry_run, "created": False, "operation": op})
        return result
    meta = {"miles_ray": {"recipe": plan.recipe, "recipe_hash": plan.recipe_hash, "nodes": plan.nodes,
                          "gpus_per_node": plan.gpus_per_node, "layout": plan.layout, "image": cfg.image}}
    uuid = client.create_operation(cfg.polyaxon_owner, cfg.polyaxon_project, op, name=cfg.name,
                                   tags=op.get("tags"), meta=meta, known_connections=known)
    raycluster = f"plx-operation-{uuid}"
    _save_record(cfg, {"name": cfg.name, "via": "polyaxon", "raycluster": raycluster, "namespace": cfg.namespace,
                       "context": cfg.kube_context, "polyaxon_uuid": uuid, "polyaxon_project": cfg.polyaxon_project,
                       "polyaxon_owner": cfg.polyaxon_owner})
    result.update({"created": True, "polyaxon_uuid": uuid, "raycluster": raycluster})
    _say(progress, f"created Polyaxon operation {uuid} in {cfg.polyaxon_owner}/{cfg.polyaxon_project}")
    if wait and api is None:
        # no Kubernetes access: Polyaxon's own view is all there is (its run turns running once the agent
        # has created the cluster and the operator reports it); Ray itself cannot be asked from here
        _say(progress, f"waiting up to {timeout:.0f}s for Polyaxon run {uuid} to run (no kubeconfig: pods and "
                       "Ray are not checked)")
        client.wait_for_status(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, {"running"}, timeout)
        result["status"] = polyaxon_status(cfg, cluster_record(cfg))
    elif wait:
        result["status"] = wait_ready(cfg, api, raycluster, cfg.nodes, progress, timeout, ray_check)
    return result


# -- waiting --------------------------------------------------------------------------------------

def _summary(rc: dict | None, pods: list[dict], want: int) -> str:
    workers = [p for p in pods if p["role"] == "worker"]
    head = next((p for p in pods if p["role"] == "head"), None)
    scheduled = sum(1 for p in workers if p["node"])
    running = sum(1 for p in workers if p["phase"] == "Running")
    st = (rc or {}).get("status", {})
    return (f"head {head['phase'] if head else 'not created'}; workers scheduled {scheduled}/{want}, "
            f"running {running}/{want}; RayCluster ready workers {st.get('readyWorkerReplicas', 0)}/{want}")


def wait_ready(cfg: MilesRayConfig, api, name: str, want: int, progress: Progress, timeout: float,
               ray_check: bool) -> dict[str, Any]:
    """Pods scheduled -> running -> RayCluster ready -> N GPU workers ALIVE in Ray. Fails fast on pods that
    cannot be scheduled or whose containers cannot start; survives API server restarts until the timeout."""
    rays = kube.RayClusters(api)
    deadline = time.monotonic() + timeout
    unschedulable_seen: dict[str, int] = {}
    last = ""
    queued = ""  # why Kueue holds the cluster back, while it does
    while True:
        try:
            rc = rays.get(cfg.namespace, name)
            pods = kube.cluster_pods(api, cfg.namespace, name)
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
    out = status(cfg, api_client=api, name=name, with_ray=False)
    if ray_check:
        out["ray"] = wait_ray_joined(cfg, api, name, want, progress, max(5.0, deadline - time.monotonic()))
    return out


def _kueue_wait(api, namespace: str, name: str, rc: dict) -> str:
    """The progress line of a RayCluster Kueue has not admitted yet: its queue and Kueue's reason."""
    workload = kube.kueue_workload(api, namespace, rc["metadata"].get("uid", ""))
    return (f"waiting for Kueue to admit RayCluster {namespace}/{name} (LocalQueue {kueue_queue_of(rc)}; the whole "
            f"gang at once, no pods until then): {kueue_pending_reason(workload)}")


def _ready_workers(pods: list[dict]) -> list[dict]:
    """The worker pods (of ``kube.cluster_pods``) that are ready and not being deleted."""
    return [p for p in pods if p["role"] == "worker" and p["ready"] and not p["deleting"]]


def wait_ray_joined(cfg: MilesRayConfig, api, name: str, want: int, progress: Progress, timeout: float) -> dict:
    """Wait until ``want`` GPU worker pods of now are ALIVE in Ray (matched by pod IP: the Ray node of a pod
    deleted a moment ago stays ALIVE until its health check fails and does not count)."""

    def worker_ips() -> set[str]:
        return {p["ip"] for p in _ready_workers(kube.cluster_pods(api, cfg.namespace, name)) if p["ip"]}

    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        _say(progress, f"waiting for {want} GPU worker(s) to join Ray (dashboard via port-forward {url})")
        return ray_jobs.wait_for_gpu_nodes(url, want, cfg.gpus_per_node, timeout, progress, among=worker_ips)


# -- status, scale, down --------------------------------------------------------------------------

def polyaxon_status(cfg: MilesRayConfig, rec: dict[str, Any], with_ray: bool = False) -> dict[str, Any]:
    """A Polyaxon-made cluster seen through Polyaxon only (no kubeconfig): its run's status and conditions."""
    client, owner, project = _polyaxon(cfg, rec)
    run = client.get_run(owner, project, rec["polyaxon_uuid"], with_conditions=True)
    notice = ("no kubeconfig: the run's status and conditions come from Polyaxon; pods"
              + (", Ray nodes" if with_ray else "") + " and the RayCluster's own status need Kubernetes access")
    return {"name": cfg.name, "backend": "kubernetes", "via": "polyaxon", "kubernetes": False,
            "namespace": rec.get("namespace", cfg.namespace), "raycluster": rec.get("raycluster"),
            "polyaxon_uuid": rec["polyaxon_uuid"], "polyaxon_project": f"{owner}/{project}",
            "polyaxon_status": run.get("status"), "polyaxon_conditions": run.get("conditions") or [],
            "notices": [notice]}


def taken_down(cfg: MilesRayConfig) -> dict[str, Any] | None:
    """What 'down' recorded of a cluster made through Polyaxon that no 'up' has made again, or None."""
    if state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name)) is not None:
        return None
    return state.read_kube_down(cfg.kube_context, cfg.namespace, cfg.name)


def down_status(cfg: MilesRayConfig, down_rec: dict[str, Any]) -> dict[str, Any]:
    """A cluster 'down' took away (its Polyaxon run stopped and deleted), as Polyaxon sees its run now: no
    Kubernetes access needed."""
    client, owner, project = _polyaxon(cfg, down_rec)
    uuid = down_rec["polyaxon_uuid"]
    out: dict[str, Any] = {"name": cfg.name, "backend": "kubernetes", "via": "polyaxon", "state": "down",
                           "down": True, "down_at": down_rec.get("down_at"), "namespace": down_rec.get("namespace"),
                           "raycluster": down_rec.get("raycluster"), "polyaxon_uuid": uuid,
                           "polyaxon_project": f"{owner}/{project}"}
    try:
        run = client.get_run(owner, project, uuid, with_conditions=False)
        out.update(polyaxon_status=run.get("status"), polyaxon_deleting=bool(run.get("deleting")))
    except NotFound:
        out.update(polyaxon_status=None, polyaxon_deleting=True)
    return out


def status(cfg: MilesRayConfig, api_client=None, name: str | None = None, with_ray: bool = False) -> dict[str, Any]:
    if api_client is None and name is None:
        down_rec = taken_down(cfg)
        if down_rec is not None:
            return down_status(cfg, down_rec)
    rec = cluster_record(cfg)
    if api_client is None and name is None and without_kubectl(cfg, rec):
        return polyaxon_status(cfg, rec, with_ray)
    api = api_client or _client(cfg)
    name = name or rec["raycluster"]
    rc = kube.RayClusters(api).get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
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
            run = polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host, retries=1).get_run(
                rec["polyaxon_owner"], rec["polyaxon_project"], rec["polyaxon_uuid"], with_conditions=False)
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
    return out


def scale(cfg: MilesRayConfig, nodes: int, progress: Progress = None, timeout: float = 600, force: bool = False,
          wait: bool = True, ray_check: bool = True) -> dict[str, Any]:
    api = _client(cfg)
    rec = cluster_record(cfg)
    name = rec["raycluster"]
    rays = kube.RayClusters(api)
    current = rays.get(cfg.namespace, name)
    if current is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    groups = current["spec"].get("workerGroupSpecs") or []
    group = next((g for g in groups if g.get("groupName") == cfg.worker_group), None)
    now = group.get("replicas", 0) if group is not None else None
    gpus, cpu, memory = _worker_shape(group, cfg)
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
    result: dict[str, Any] = {"name": cfg.name, "raycluster": name, "from": now, "to": nodes, "adjusted": notes,
                              "gpus_per_worker": gpus}
    if wait:
        start = time.monotonic()
        if queue is not None and nodes != now:
            _wait_kueue_workload(api, cfg, name, current["metadata"]["uid"], nodes, progress, timeout)
        result.update(wait_ready(cfg, api, name, nodes, progress, max(5.0, timeout - (time.monotonic() - start)),
                                 ray_check and nodes > 0))
    return result


def _worker_wants(group: dict[str, Any] | None) -> dict[str, Any]:
    """What each worker of ``group`` asks for (its Ray container): its limits, overridden by its requests."""
    containers = (((group or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}
    return {**(res.get("limits") or {}), **(res.get("requests") or {})}


def _worker_shape(group: dict[str, Any] | None, cfg: MilesRayConfig) -> tuple[int, float, float]:
    """GPUs, CPU and memory (bytes) each worker of ``group`` requests (its Ray container), as the cluster was made;
    the configured values where the group does not say."""
    want = _worker_wants(group)
    gpus = int(kube.quantity(want[kube.GPU])) if kube.GPU in want else cfg.gpus_per_node
    cpu = kube.quantity(want["cpu"]) if "cpu" in want else cfg.worker_cpu_request
    memory = kube.quantity(want["memory"]) if "memory" in want else kube.quantity(cfg.memory_per_node)
    return gpus, cpu, memory


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
    for rec in state.list_records():
        if rec.get("cluster") != cfg.name or rec.get("backend") == "local":
            continue
        need = int(rec.get("split", {}).get("nodes", 0))
        if need <= nodes:
            continue
        st = live_status(rec)
        if st in {"PENDING", "RUNNING"}:
            raise ConfigError(f"run {rec['run']!r} is {st} and needs {need} GPU nodes; refusing to scale to {nodes}",
                              hint="stop the run first, or pass --force")
        if st == "UNREACHABLE":
            raise ConfigError(f"cannot tell whether run {rec['run']!r} (needs {need} GPU nodes) is still running",
                              hint="check with 'miles-ray status RUN', or pass --force")


def _stop_and_delete_run(cfg: MilesRayConfig, rec: dict[str, Any], out: dict[str, Any]) -> None:
    """Stop the cluster's Polyaxon run, then delete it (Polyaxon's agent removes what it created)."""
    client, owner, project = _polyaxon(cfg, rec)
    uuid = rec["polyaxon_uuid"]
    run = client.get_run(owner, project, uuid, with_conditions=False)
    if run.get("status") not in polyaxon_api.FINAL_STATUSES and not run.get("deleting"):
        client.stop_run(owner, project, uuid)
    out["polyaxon_stopped"] = uuid
    client.delete_run(owner, project, uuid)
    out["polyaxon_deleted"] = uuid


def _forget(cfg: MilesRayConfig, rec: dict[str, Any]) -> None:
    """Drop the cluster's bookkeeping; for a Polyaxon-made one keep which run 'down' took away ('status' says so)."""
    if rec.get("polyaxon_uuid"):
        state.write_kube_down(cfg.kube_context, cfg.namespace, cfg.name, {
            "name": cfg.name, "namespace": rec.get("namespace", cfg.namespace), "raycluster": rec.get("raycluster"),
            "polyaxon_uuid": rec["polyaxon_uuid"], "polyaxon_owner": rec.get("polyaxon_owner"),
            "polyaxon_project": rec.get("polyaxon_project"),
            "down_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())})
    state.remove_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)


def down(cfg: MilesRayConfig, wait: bool = True, timeout: float = 120) -> dict[str, Any]:
    down_rec = taken_down(cfg)
    if down_rec is not None:  # already taken down: say so (Polyaxon's view), nothing to do
        return {**down_status(cfg, down_rec), "already_down": True}
    rec = cluster_record(cfg)
    name = rec["raycluster"]
    out: dict[str, Any] = {"name": cfg.name, "raycluster": name, "namespace": cfg.namespace,
                           "storage": "kept (PVCs, connections and checkpoints are never deleted)"}
    if without_kubectl(cfg, rec):
        _stop_and_delete_run(cfg, rec, out)
        out.update(kubernetes=False, notices=["no kubeconfig: the Polyaxon run was stopped and deleted; its agent "
                                              "removes the RayCluster and pods (not watched from here)"])
        _forget(cfg, rec)
        return out
    api = _client(cfg)
    if rec.get("polyaxon_uuid"):
        _stop_and_delete_run(cfg, rec, out)
    deleted = kube.RayClusters(api).delete(cfg.namespace, name)
    if not deleted and not rec.get("polyaxon_uuid"):
        raise NotFound(f"no RayCluster {cfg.namespace}/{name} to delete")
    out["deleted"] = deleted
    if wait and deleted:
        deadline = time.monotonic() + timeout
        while kube.cluster_pods(api, cfg.namespace, name) or kube.RayClusters(api).get(cfg.namespace, name):
            if time.monotonic() > deadline:
                out["pods_remaining"] = len(kube.cluster_pods(api, cfg.namespace, name))
                break
            time.sleep(POLL)
    _forget(cfg, rec)
    return out
