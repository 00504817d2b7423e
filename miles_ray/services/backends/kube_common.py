"""What the two Kubernetes backends (KubeRay directly, KubeRay through Polyaxon) share: the cluster's
bookkeeping, the preflight, the waits for pods and Ray, the RayCluster's status read, scaling the worker group
(with its guards: running jobs, Kueue, KubeRay's autoscaler), idle detection through a port-forward, and
deleting a RayCluster."""

from __future__ import annotations

import time
from typing import Any, Callable

from miles_ray.adapters import kube, polyaxon_api, polyaxon_spec, ray_jobs, state
from miles_ray.adapters.ray_head import open_head
from miles_ray.core.builders import RAY_TOKEN_KEY
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.crd_fields import first_unknown_field, kuberay_version_needed, unknown_fields
from miles_ray.core.errors import (ClusterError, ConfigError, Conflict, Forbidden, Invalid, NotFound, TimedOut,
                                   Unreachable)
from miles_ray.core.heads import k8s_address, service_url
from miles_ray.core.progress import Progress, say as _say
from miles_ray.core.queues import kueue_pending_reason, kueue_queue_of, kueue_queued
from miles_ray.services import saved_runs
from miles_ray.services.backends.results import IdleReport, KubeScale, KubeStatus, Preflight, SavedRuns
from miles_ray.services.runs import live_status
from miles_ray.services.backends.idle import idle_report
from miles_ray.services.queues import check_queue

POLL = 1.0
#: Ray's dashboard agent listens on this port in every pod KubeRay makes (``--dashboard-agent-listen-port``), on
#: the pod's loopback too, and stops with the pod's Ray: nothing answers there once Ray has stopped in the pod.
RAY_AGENT_PORT = 52365
#: A pod's agent port must refuse twice, this far apart, before its grace period is cut: the raylet ends a moment
#: after its agent (``ray stop`` signals both) and tells the GCS it is leaving on its way out.
REFUSED_FOR_SECONDS = 1.0
STORAGE_KEPT = "kept (PVCs, connections and checkpoints are never deleted)"
UNSCHEDULABLE_POLLS = 2  # an Unschedulable condition seen on this many polls in a row fails the wait


# -- where a cluster's bookkeeping lives ----------------------------------------------------------

def cluster_record(cfg: MilesRayConfig) -> dict[str, Any]:
    """Which RayCluster the configured name is (and the Polyaxon run behind it), as 'up' recorded it."""
    return state.read_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)


def recorded_via(cfg: MilesRayConfig) -> str:
    """Which Kubernetes backend made the configured cluster, as this machine's bookkeeping says: the record
    'up' wrote; without one, a cluster 'down' took away (only a Polyaxon-made one leaves that), else KubeRay
    (a RayCluster of that name made directly)."""
    rec = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name))
    if rec is not None:
        return rec.get("via") or "kuberay"
    return "polyaxon" if state.read_kube_down(cfg.kube_context, cfg.namespace, cfg.name) is not None else "kuberay"


def save_record(cfg: MilesRayConfig, record: dict[str, Any], token_secret: str) -> None:
    """Also records the cluster's Ray auth, which a later submit (launcher job) must match: the mode and the
    Secret holding the token (``token_secret``: the one the operation references, or KubeRay's)."""
    secret = token_secret if cfg.ray_auth == "token" else None
    state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name,
                             {**record, "ray_auth": cfg.ray_auth, "ray_token_secret": secret})


def client(cfg: MilesRayConfig):
    return kube.load_client(cfg.kubeconfig, cfg.kube_context)


def without_kubectl(cfg: MilesRayConfig, rec: dict[str, Any] | None = None) -> str | None:
    """For a cluster made through Polyaxon (or about to be, ``rec`` None): the kubeconfig path that does not
    exist when there is no Kubernetes access at all (a Polyaxon user without kubectl), else None. An
    explicit --kubeconfig/config ``kubeconfig`` that does not exist stays an error (``client`` says so)."""
    if cfg.kubeconfig or (rec is not None and not rec.get("polyaxon_uuid")):
        return None
    return kube.missing_kubeconfig(None)


def polyaxon(cfg: MilesRayConfig, rec: dict[str, Any] | None = None):
    """(client, owner, project) of the cluster's Polyaxon run (as 'up' recorded it) or of the config."""
    rec = rec or {}
    return (polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host), rec.get("polyaxon_owner") or cfg.polyaxon_owner,
            rec.get("polyaxon_project") or cfg.polyaxon_project)


def get_raycluster(api, cfg: MilesRayConfig, name: str) -> dict[str, Any]:
    rc = kube.RayClusters(api).get(cfg.namespace, name)
    if rc is None:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name}", hint="create one with 'miles-ray up'")
    return rc


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
    """Refuse (exit 2) the fields of the rendered RayCluster that the installed CRD's schema does not declare,
    naming the first (and the version it needs) and any others: the API server would silently drop them (e.g.
    ``spec.authOptions`` on KubeRay < v1.5.1 -- the cluster would then come up without token authentication)."""
    if not schema:
        return  # a CRD without a structural schema prunes nothing
    unknown = first_unknown_field(rendered, schema)
    if unknown is None:
        return
    path, value = unknown
    others = [p for p in unknown_fields(rendered, schema) if p != path]
    raise Invalid(f"the KubeRay operator installed on this cluster does not know RayCluster field {path} "
                  f"(its CRD has no such field; the API server would drop it); it needs KubeRay >= "
                  f"{kuberay_version_needed(path, value)}"
                  + (f"; it does not know {', '.join(others[:5])} either" if others else ""),
                  hint="upgrade the KubeRay operator and its CRDs, or change the setting that renders it")


def preflight(cfg: MilesRayConfig, api_client, nodes: int, claim: bool, reconciling: bool = False,
              rendered: dict | None = None) -> Preflight:
    """Everything that must hold before anything is created. Raises a typed error saying what fails.
    ``claim``: the shared volume's claim must exist (KubeRay: miles-ray mounts it itself). ``rendered``: the
    RayCluster that will be created, checked field by field against the installed CRD."""
    report = Preflight()
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
    report.crd_versions = versions
    queue = check_queue(cfg, api_client)
    if queue is not None:
        report.queue = queue
    if rendered is not None:
        check_fields_known(rendered, kube.crd_schema(crd))
    if claim and not kube.pvc_exists(api_client, cfg.namespace, cfg.claim):
        raise NotFound(f"PersistentVolumeClaim {cfg.namespace}/{cfg.claim} does not exist",
                       hint="create the shared volume for models, data and checkpoints, or set volume_claim")
    if not reconciling:
        cap = kube.gpu_capacity(api_client, cfg.node_selector,
                                [t.model_dump(exclude_none=True) for t in cfg.tolerations])
        cpu = cfg.worker_cpu_request
        mem = kube.quantity(cfg.memory_per_node)
        fitting = cap.fitting(cfg.gpus_per_node, cpu, mem)
        report.gpu_nodes = len(cap.nodes)
        report.gpu_nodes_fitting = len(fitting)
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


# -- waiting --------------------------------------------------------------------------------------

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
    """Wait until ``want`` GPU worker pods of now are ALIVE in Ray (matched by pod IP: the Ray node of a pod
    deleted a moment ago stays ALIVE until its health check fails and does not count)."""

    def worker_ips() -> set[str]:
        return {p["ip"] for p in _ready_workers(kube.cluster_pods(api, cfg.namespace, name)) if p["ip"]}

    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        _say(progress, f"waiting for {want} GPU worker(s) to join Ray (dashboard via port-forward {url})")
        return ray_jobs.wait_for_gpu_nodes(url, want, cfg.gpus_per_node, timeout, progress, among=worker_ips)


# -- status, scale, idle, delete -------------------------------------------------------------------

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
    return KubeStatus(**out)


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
    result = KubeScale(**{"name": cfg.name, "raycluster": name, "from": now, "to": nodes, "adjusted": notes,
                          "gpus_per_worker": gpus})
    if wait:
        start = time.monotonic()
        if queue is not None and nodes != now:
            _wait_kueue_workload(api, cfg, name, current["metadata"]["uid"], nodes, progress, timeout)
        result.with_status(wait_ready(cfg, api, name, nodes, progress, max(5.0, timeout - (time.monotonic() - start)),
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
    """Refuse to shrink RayCluster ``name`` below what a pending or running run on it needs, or when a run on it
    cannot be read (--force overrides)."""
    on_it = saved_runs.records_on([k8s_address(cfg.namespace, name), service_url(cfg.namespace, name)])
    for rec in on_it:
        if rec.get("cluster") != cfg.name:
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


def cluster_idle(cfg: MilesRayConfig) -> IdleReport:
    """:func:`miles_ray.services.lifecycle.idle_report` of the configured cluster, through a port-forward to its
    head."""
    name = cluster_record(cfg)["raycluster"]
    with open_head(k8s_address(cfg.namespace, name), kube_context=cfg.kube_context,
                   kubeconfig=cfg.kubeconfig) as url:
        return idle_report(url)


def save_runs(cfg: MilesRayConfig) -> SavedRuns:
    """Save the jobs of the runs recorded on this cluster (by either address its head is known by)."""
    rc = cluster_record(cfg)["raycluster"]
    head = k8s_address(cfg.namespace, rc)
    return saved_runs.save_cluster_runs(saved_runs.records_on([head, service_url(cfg.namespace, rc)]), head,
                                        kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig)


def delete_raycluster(cfg: MilesRayConfig, api, name: str, out: Any, wait: bool, timeout: float,
                      missing_ok: bool, propagation: str = "Foreground") -> None:
    """Delete the RayCluster ``name`` (``propagation``: see ``RayClusters.delete``) and (``wait``) wait until it and
    its pods are gone; ``out.deleted`` says whether there was one (``out.pods_remaining``: what was left at the
    timeout)."""
    deleted = kube.RayClusters(api).delete(cfg.namespace, name, propagation)
    if not deleted and not missing_ok:
        raise NotFound(f"no RayCluster {cfg.namespace}/{name} to delete")
    out.deleted = deleted
    if wait:
        wait_gone(cfg, api, name, out, timeout)


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


def remove_polyaxon_made(cfg: MilesRayConfig, api, name: str, out: Any, agent_seconds: float, timeout: float) -> None:
    """After its Polyaxon run was stopped: wait until the RayCluster ``name`` and its pods are gone (``out.deleted``,
    ``out.pods_remaining`` and ``out.notices`` of a :class:`KubeDown`).

    Polyaxon's agent deletes the ``Cluster`` it made, and the RayCluster goes with it (its ownerReference). Deleting
    the RayCluster here while that Cluster still exists would not take it down: Polyaxon's operator makes it again
    (seen on real pods: new pods a few seconds after the old ones went). So the agent is given ``agent_seconds``;
    a RayCluster still there and not being deleted then has its owner deleted (the agent's Cluster), or itself
    when it has no owner, and a notice says so."""
    clusters = kube.RayClusters(api)
    rc = clusters.get(cfg.namespace, name)
    out.deleted = rc is not None
    deadline = time.monotonic() + agent_seconds
    while rc is not None and not rc["metadata"].get("deletionTimestamp") and time.monotonic() < deadline:
        time.sleep(POLL)
        rc = clusters.get(cfg.namespace, name)
    if rc is not None and not rc["metadata"].get("deletionTimestamp"):
        owners = [r for r in rc["metadata"].get("ownerReferences") or [] if r.get("controller")]
        if owners and clusters.delete_owner(cfg.namespace, owners[0]):
            gone = f"its {owners[0]['kind']} {owners[0]['name']}"
        else:
            clusters.delete(cfg.namespace, name)
            gone = "the RayCluster"
        out.notices.append(f"Polyaxon's agent had not removed RayCluster {name} {agent_seconds:.0f}s after its run "
                           f"was stopped: deleted {gone} from here")
    wait_gone(cfg, api, name, out, timeout)


def guarded(cfg: MilesRayConfig, name: str) -> Callable[[], None]:
    """The running-job guard of parking (shrinking to 0 GPU nodes) a RayCluster."""
    return lambda: refuse_shrink(cfg, name, 0)


def idle_or_unknown(cfg: MilesRayConfig) -> IdleReport:
    """:func:`cluster_idle`, or why it cannot be told (the head cannot be reached)."""
    try:
        return cluster_idle(cfg)
    except ClusterError as e:
        return IdleReport(idle=None, reason=str(e).splitlines()[0])

