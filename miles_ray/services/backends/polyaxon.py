"""The Polyaxon backend: a Polyaxon raycluster operation whose agent creates the RayCluster. Polyaxon owns that
RayCluster: parking stops the run and keeps the operation it was created from ('resume' creates it again);
'down' stops and deletes the run. Without any kubeconfig (a Polyaxon user without kubectl) Polyaxon's own view
is all there is: the Kubernetes preflight and the pod and Ray checks are skipped, saying so."""

from __future__ import annotations

import time
from typing import Any

from miles_ray.adapters import kube, polyaxon_api, polyaxon_spec, state
from miles_ray.adapters.kube.preflight import service_account_denied
from miles_ray.core.builders import ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, NotFound, TimedOut
from miles_ray.core.prepare import ClusterDocuments
from miles_ray.core.progress import Progress, say
from miles_ray.services import k8s_clusters, polyaxon_where
from miles_ray.services.backends.drift import refuse_drift
from miles_ray.services.backends.idle import iso, park_gate
from miles_ray.services.backends.kube import bookkeeping, preflight, scaling, sidecars, status, teardown, waits
from miles_ray.services.backends.results import (DownCluster, KubeDown, KubeResume, KubeScale, KubeStatus, KubeUp,
                                                 ParkedCluster, ParkResult, PolyaxonRunStatus, Preflight)


#: How long 'down' gives Polyaxon's agent to remove the cluster of a stopped run before removing it from here.
AGENT_SECONDS = 60.0
#: A run in one of these statuses has made nothing on Kubernetes yet: its agent has nothing to remove.
NOT_HANDED_TO_THE_AGENT = frozenset({"created", "compiled", "on_schedule", "queued"})

#: What Polyaxon's ``polyaxon-sidecar`` (in every pod the agent makes) reads through the in-cluster API as the pod's
#: service account: the pod and its status (without pods/status it retries forever), the main container's logs,
#: services and events. Without it the sidecar exits at once and, the pods' restartPolicy being Never, a pod never
#: becomes Ready: the RayCluster never turns ready and 'up' would wait for nothing.
SIDECAR_ACCESS: list[tuple[str, str]] = [(verb, res) for res in ("pods", "pods/status", "pods/log", "services", "events")
                                         for verb in ("get", "list", "watch")]


def _runs_service_account(op: dict[str, Any]) -> str:
    """The service account the operation's pods run as: the one its head names, else the namespace's default."""
    head = ((op.get("component") or {}).get("run") or {}).get("head") or {}
    return (head.get("environment") or {}).get("serviceAccountName") or "default"


def check_sidecar_access(cfg: MilesRayConfig, api, op: dict[str, Any], progress: Progress) -> str:
    """Refuse, before anything is created, an operation whose pods' service account may not do what Polyaxon's
    sidecar needs (:data:`SIDECAR_ACCESS`), naming what is missing and the commands that grant it. Returns a
    notice when the caller may not ask the API server (then nothing is known), else ''."""
    sa = _runs_service_account(op)
    say(progress, f"preflight: what service account {cfg.namespace}/{sa} may do for Polyaxon's sidecar")
    denied = service_account_denied(api, cfg.namespace, sa, SIDECAR_ACCESS)
    if denied is None:
        return (f"could not check what service account {cfg.namespace}/{sa} may do (you may not create "
                "LocalSubjectAccessReviews): Polyaxon's sidecar in every pod needs get/list/watch on pods, "
                "pods/status, pods/log, services and events, or the pods never become Ready")
    if denied:
        resources = sorted({res for _, res in denied}, key=[r for _, r in SIDECAR_ACCESS].index)
        verbs = sorted({verb for verb, _ in denied}, key=["get", "list", "watch"].index)
        raise ClusterError(
            f"service account {cfg.namespace}/{sa} may not {', '.join(verbs)} {', '.join(resources)}: Polyaxon's "
            "sidecar in every pod of the operation reads them through the Kubernetes API, and without that it exits "
            "and the pods never become Ready; nothing was created",
            hint=(f"ask an admin to run: kubectl -n {cfg.namespace} create role polyaxon-runs --verb=get,list,watch "
                  "--resource=pods,pods/status,pods/log,services,events && kubectl -n "
                  f"{cfg.namespace} create rolebinding polyaxon-runs --role=polyaxon-runs "
                  f"--serviceaccount={cfg.namespace}:{sa}"))
    return ""


def without_kubectl(cfg: MilesRayConfig, rec: dict[str, Any] | None = None) -> str | None:
    """For a cluster made through Polyaxon (or about to be, ``rec`` None): the kubeconfig path that does not
    exist when there is no Kubernetes access at all (a Polyaxon user without kubectl), else None. An
    explicit --kubeconfig/config ``kubeconfig`` that does not exist stays an error (``bookkeeping.client`` says
    so)."""
    if cfg.kubeconfig or (rec is not None and not rec.get("polyaxon_uuid")):
        return None
    return kube.missing_kubeconfig(None)


def _polyaxon(cfg: MilesRayConfig, rec: dict[str, Any] | None = None):
    """(client, owner, project) of the cluster's Polyaxon run (on the host, owner and project 'up' recorded, else
    the config's)."""
    ref = polyaxon_where.resolve("cluster", rec, cfg)
    return polyaxon_where.client(ref), ref.owner, ref.project


def polyaxon_preflight(cfg: MilesRayConfig, op: dict, progress: Progress = None):
    """Before creating an operation: the project exists, and (when the agent's connections are known) every
    connection the operation names is one the agent has. Returns (client, known connections or None)."""
    client = polyaxon_where.client(polyaxon_where.resolve("cluster", None, cfg))
    say(progress, f"checking Polyaxon project {cfg.polyaxon_owner}/{cfg.polyaxon_project} at {client.host}")
    client.check_project(cfg.polyaxon_owner, cfg.polyaxon_project)
    known = polyaxon_api.list_agent_connections()
    if known is not None:
        missing = sorted(set(polyaxon_spec.connection_names(op)) - set(known))
        if missing:
            raise NotFound(f"the Polyaxon agent does not know connection(s) {', '.join(missing)} "
                           f"(known: {', '.join(sorted(known)) or 'none'})",
                           hint="register the connection in the agent config, or set 'connection'")
    return client, known


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
        time.sleep(waits.POLL)
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
    waits.wait_gone(cfg, api, name, out, timeout)


def polyaxon_status(cfg: MilesRayConfig, rec: dict[str, Any], with_ray: bool = False) -> PolyaxonRunStatus:
    """A Polyaxon-made cluster seen through Polyaxon only (no kubeconfig): its run's status and conditions."""
    client, owner, project = _polyaxon(cfg, rec)
    run = client.get_run(owner, project, rec["polyaxon_uuid"], with_conditions=True)
    notice = ("no kubeconfig: the run's status and conditions come from Polyaxon; pods"
              + (", Ray nodes" if with_ray else "") + " and the RayCluster's own status need Kubernetes access")
    return PolyaxonRunStatus(name=cfg.name, backend="kubernetes", via="polyaxon", kubernetes=False,
                             namespace=rec.get("namespace", cfg.namespace), raycluster=rec.get("raycluster"),
                             polyaxon_uuid=rec["polyaxon_uuid"], polyaxon_project=f"{owner}/{project}",
                             polyaxon_status=run.get("status"), polyaxon_conditions=run.get("conditions") or [],
                             notices=[notice])


def _taken_down(cfg: MilesRayConfig) -> dict[str, Any] | None:
    """What 'down' recorded of a cluster made through Polyaxon that no 'up' has made again, or None."""
    if state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name)) is not None:
        return None
    return state.read_kube_down(cfg.kube_context, cfg.namespace, cfg.name)


def down_status(cfg: MilesRayConfig, down_rec: dict[str, Any]) -> DownCluster:
    """A cluster 'down' took away (its Polyaxon run stopped and deleted), as Polyaxon sees its run now: no
    Kubernetes access needed."""
    client, owner, project = _polyaxon(cfg, down_rec)
    uuid = down_rec["polyaxon_uuid"]
    out = DownCluster(name=cfg.name, backend="kubernetes", via="polyaxon", state="down", down=True,
                      down_at=down_rec.get("down_at"), namespace=down_rec.get("namespace"),
                      raycluster=down_rec.get("raycluster"), polyaxon_uuid=uuid,
                      polyaxon_project=f"{owner}/{project}")
    try:
        run = client.get_run(owner, project, uuid, with_conditions=False)
        out.update(polyaxon_status=run.get("status"), polyaxon_deleting=bool(run.get("deleting")))
    except NotFound:
        out.update(polyaxon_status=None, polyaxon_deleting=True)
    return out


def _stop_run(cfg: MilesRayConfig, rec: dict[str, Any], out: KubeDown) -> str | None:
    """Stop the cluster's Polyaxon run (Polyaxon's agent then removes what it created); the run's status before."""
    client, owner, project = _polyaxon(cfg, rec)
    uuid = rec["polyaxon_uuid"]
    run = client.get_run(owner, project, uuid, with_conditions=False)
    if run.get("status") not in polyaxon_api.FINAL_STATUSES and not run.get("deleting"):
        client.stop_run(owner, project, uuid)
    out.polyaxon_stopped = uuid
    return run.get("status")


def _delete_run(cfg: MilesRayConfig, rec: dict[str, Any], out: KubeDown) -> None:
    """Delete the cluster's Polyaxon run, once its agent has acted on the stop: Polyaxon hands its agent only the
    stopping runs that are not being deleted, so a run deleted right after its stop can keep its cluster (seen on
    real pods: the agent never removed it, half of the times)."""
    client, owner, project = _polyaxon(cfg, rec)
    client.delete_run(owner, project, rec["polyaxon_uuid"])
    out.polyaxon_deleted = rec["polyaxon_uuid"]


def _forget(cfg: MilesRayConfig, rec: dict[str, Any]) -> None:
    """Drop the cluster's bookkeeping; for a Polyaxon-made one keep which run 'down' took away ('status' says so)."""
    if rec.get("polyaxon_uuid"):
        state.write_kube_down(cfg.kube_context, cfg.namespace, cfg.name, {
            "name": cfg.name, "namespace": rec.get("namespace", cfg.namespace), "raycluster": rec.get("raycluster"),
            "polyaxon_uuid": rec["polyaxon_uuid"], "polyaxon_owner": rec.get("polyaxon_owner"),
            "polyaxon_project": rec.get("polyaxon_project"),
            "down_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())})
    state.remove_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)


def _refuse_changed(cfg: MilesRayConfig, client, wanted: dict[str, Any]) -> None:
    """'up' again of a cluster whose Polyaxon run is live: another size, GPUs per node or image is refused (exit 2)
    naming the fix, as on the other backends (:func:`miles_ray.services.backends.drift.refuse_drift`)."""
    rec = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name))
    if not rec or not rec.get("polyaxon_uuid") or rec.get("parked"):
        return
    try:
        run = client.get_run(rec["polyaxon_owner"], rec["polyaxon_project"], rec["polyaxon_uuid"],
                             with_conditions=False)
    except NotFound:
        return  # gone: 'up' creates it again
    if run.get("status") in polyaxon_api.FINAL_STATUSES or run.get("deleting"):
        return
    live = ((run.get("meta_info") or {}).get("miles_ray")) or {}
    differ = [k for k in ("nodes", "gpus_per_node", "image") if k in live and live[k] != wanted[k]]
    diffs = [f"{k} {live[k]} != {wanted[k]}" for k in differ]
    refuse_drift(f"the Polyaxon run {rec['polyaxon_uuid']} of cluster {cfg.name!r}", diffs,
                 live_nodes=live.get("nodes") if "nodes" in differ else None,
                 scale_to=wanted["nodes"] if "nodes" in differ else None,
                 rest_differs=len(differ) > int("nodes" in differ))


class PolyaxonBackend:
    name = "kubernetes"
    on_this_machine = False
    via = "polyaxon"

    def up(self, cfg: MilesRayConfig, *, progress: Progress = None, timeout: float = 600, dry_run: str | None = None,
           wait: bool = True, ray_check: bool = True) -> KubeUp:
        return k8s_clusters.up(cfg, self, progress=progress, timeout=timeout, dry_run=dry_run, wait=wait,
                               ray_check=ray_check)

    def create(self, cfg: MilesRayConfig, objects: ClusterDocuments, progress: Progress, timeout: float,
               dry_run: str | None, wait: bool, ray_check: bool) -> KubeUp:
        """After the preflight (Kubernetes', when there is a kubeconfig; then Polyaxon's), create the operation
        and (``wait``) wait until every GPU worker has joined Ray (without Kubernetes access: until Polyaxon
        says its run runs)."""
        missing = without_kubectl(cfg)
        if missing:
            token = (f", {preflight.unchecked_token_secret(cfg, ray_token_secret(cfg))}" if cfg.ray_auth == "token"
                     else "")
            notice = (f"no kubeconfig ({missing} does not exist): the Kubernetes preflight (namespace, KubeRay CRD, "
                      f"{cfg.nodes} free GPU node(s) x {cfg.gpus_per_node}{token}) is skipped; Polyaxon's agent "
                      "schedules the operation")
            result = KubeUp(name=cfg.name, namespace=cfg.namespace, via=self.via, warnings=objects.warnings,
                            preflight=Preflight(skipped="no kubeconfig"), notices=[notice], kubernetes=False)
            return self._create(cfg, None, objects, result, progress, timeout, dry_run, wait, ray_check)
        api = bookkeeping.client(cfg)
        say(progress, f"preflight: namespace {cfg.namespace}, KubeRay CRD, {cfg.nodes} GPU node(s) x {cfg.gpus_per_node}")
        report = preflight.preflight(cfg, api, cfg.nodes, False)
        if cfg.ray_auth == "token":
            say(progress, f"preflight: the Ray token Secret {cfg.namespace}/{ray_token_secret(cfg)}")
            report.ray_token_secret = preflight.check_token_secret(cfg, api, ray_token_secret(cfg),
                                                                   "the operation's head and workers")
        unchecked = check_sidecar_access(cfg, api, objects.operation or {}, progress)
        result = KubeUp(name=cfg.name, namespace=cfg.namespace, via=self.via, preflight=report,
                        warnings=objects.warnings, notices=[unchecked] if unchecked else [])
        return self._create(cfg, api, objects, result, progress, timeout, dry_run, wait, ray_check)

    def _create(self, cfg: MilesRayConfig, api, objects: ClusterDocuments, result: KubeUp, progress: Progress,
                timeout: float, dry_run: str | None, wait: bool, ray_check: bool) -> KubeUp:
        op, plan = objects.operation or {}, objects.plan
        client, known = polyaxon_preflight(cfg, op, progress)
        if dry_run:
            result.update(dry_run=dry_run, created=False, operation=op)
            return result
        meta = {"miles_ray": {"recipe": plan.recipe, "recipe_hash": plan.recipe_hash, "nodes": plan.nodes,
                              "gpus_per_node": plan.gpus_per_node, "layout": plan.layout, "image": cfg.image}}
        _refuse_changed(cfg, client, meta["miles_ray"])
        uuid = client.create_operation(cfg.polyaxon_owner, cfg.polyaxon_project, op, name=cfg.name,
                                       tags=op.get("tags"), meta=meta, known_connections=known)
        raycluster = f"plx-operation-{uuid}"
        bookkeeping.save_record(cfg, {"name": cfg.name, "via": self.via, "raycluster": raycluster,
                                      "namespace": cfg.namespace, "context": cfg.kube_context, "polyaxon_uuid": uuid,
                                      "polyaxon_project": cfg.polyaxon_project, "polyaxon_owner": cfg.polyaxon_owner,
                                      "polyaxon_host": client.host,
                                      "polyaxon_host_in_cluster": cfg.polyaxon_host_in_cluster or client.host},
                                ray_token_secret(cfg))
        result.update(created=True, polyaxon_uuid=uuid, raycluster=raycluster)
        say(progress, f"created Polyaxon operation {uuid} in {cfg.polyaxon_owner}/{cfg.polyaxon_project}")
        if wait and api is None:
            # no Kubernetes access: Polyaxon's own view is all there is (its run turns running once the agent
            # has created the cluster and the operator reports it); Ray itself cannot be asked from here
            say(progress, f"waiting up to {timeout:.0f}s for Polyaxon run {uuid} to run (no kubeconfig: pods and "
                          "Ray are not checked)")
            client.wait_for_status(cfg.polyaxon_owner, cfg.polyaxon_project, uuid, {"running"}, timeout)
            result.status = polyaxon_status(cfg, bookkeeping.cluster_record(cfg))
        elif wait:
            result.status = waits.wait_ready(cfg, api, raycluster, cfg.nodes, progress, timeout, ray_check)
        return result

    def status(self, cfg: MilesRayConfig, *, with_ray: bool = False) -> (
            KubeStatus | PolyaxonRunStatus | DownCluster | ParkedCluster):
        """What 'park' kept of it; the run 'down' took away; the run as Polyaxon sees it (no kubeconfig); else
        the RayCluster (and, ``with_ray``, since when it is idle)."""
        rec = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name)) or {}
        if rec.get("parked"):
            p = rec["parked"]
            return ParkedCluster(name=cfg.name, backend=self.name, via=self.via, parked=True,
                                 parked_at=p.get("parked_at"), stopped_uuid=p.get("stopped_uuid"))
        down_rec = _taken_down(cfg)
        if down_rec is not None:
            return down_status(cfg, down_rec)
        rec = bookkeeping.cluster_record(cfg)
        st: KubeStatus | PolyaxonRunStatus
        if without_kubectl(cfg, rec):
            st = polyaxon_status(cfg, rec, with_ray)
        else:
            st = status.raycluster_status(cfg, bookkeeping.client(cfg), rec["raycluster"], with_ray)
        if with_ray:
            st.idle = teardown.idle_or_unknown(cfg)
        return st

    def refuse_scale(self, cfg: MilesRayConfig) -> None:
        scaling.refuse_scale_if_autoscaled(cfg)

    def scale(self, cfg: MilesRayConfig, nodes: int, *, progress: Progress = None, timeout: float = 300,
              force: bool = False, wait: bool = True, ray_check: bool = True) -> KubeScale:
        return scaling.scale(cfg, nodes, progress=progress, timeout=timeout, force=force, wait=wait,
                             ray_check=ray_check)

    def park(self, cfg: MilesRayConfig, *, force: bool = False, if_idle_for: float | None = None, wait: bool = True,
             timeout: float = 300, progress: Progress = None) -> ParkResult:
        """Polyaxon owns its RayCluster (the run's operator would undo a suspend): stop the run, keep the operation
        it was created from, and 'resume' creates it again."""
        rec = bookkeeping.cluster_record(cfg)
        out = ParkResult(name=cfg.name, via=self.via, parked=True)
        if rec.get("parked"):
            out.update(already_parked=True, operation_of=rec["parked"]["stopped_uuid"])
            return out
        skip, report = park_gate(cfg, if_idle_for, force, lambda: teardown.cluster_idle(cfg),
                                 scaling.guarded(cfg, rec["raycluster"]))
        if skip:
            return skip
        if report:
            out.idle = report
        client, owner, project = _polyaxon(cfg, rec)
        run = client.get_run(owner, project, rec["polyaxon_uuid"], with_conditions=False)
        if not isinstance(run.get("raw_content"), dict):
            raise ClusterError(f"Polyaxon run {rec['polyaxon_uuid']} does not return the operation it was created "
                               "from", hint="'miles-ray down' then 'up' instead")
        if state.list_records():
            out.saved_runs = teardown.save_runs(cfg)
        parked = {"operation": run["raw_content"], "run_name": run.get("name") or cfg.name, "tags": run.get("tags"),
                  "meta": run.get("meta_info"), "stopped_uuid": rec["polyaxon_uuid"], "parked_at": iso(time.time())}
        state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name, {**rec, "parked": parked})
        client.stop_run(owner, project, rec["polyaxon_uuid"])
        say(progress, f"stopped Polyaxon run {rec['polyaxon_uuid']}; its operation is kept for 'resume'")
        out.stopped_uuid = rec["polyaxon_uuid"]
        if wait and not without_kubectl(cfg, rec):
            # Polyaxon's agent removes the run's cluster; its pods stop gracefully (preStop: ray stop) and hold their
            # CPUs and GPUs until they are gone: a 'resume' right after would find its new pods unschedulable.
            api, deadline = bookkeeping.client(cfg), time.monotonic() + timeout
            lingering = sidecars.LingeringSidecars(cfg, api, rec["raycluster"], progress)
            while pods := lingering.pods():
                if time.monotonic() > deadline:
                    raise TimedOut(f"Polyaxon run {rec['polyaxon_uuid']} is stopped but {len(pods)} pod(s) of "
                                   f"{rec['raycluster']} are still there after {timeout:.0f}s",
                                   hint="'miles-ray status' shows them; 'miles-ray park' again waits")
                say(progress, f"waiting for {len(pods)} pod(s) to go")
                time.sleep(waits.POLL)
            out.grace_cut = sorted(lingering.cut)
        return out

    def resume(self, cfg: MilesRayConfig, *, wait: bool = True, ray_check: bool = True, timeout: float = 600,
               progress: Progress = None) -> KubeResume:
        """Create the run again from the operation 'park' kept, and (``wait``) wait until every GPU worker has
        joined Ray."""
        rec = bookkeeping.cluster_record(cfg)
        api = bookkeeping.client(cfg)
        parked = rec.get("parked")
        if not parked:
            return KubeResume(name=cfg.name, via=self.via, resumed=False, reason="it was not parked",
                              polyaxon_uuid=rec.get("polyaxon_uuid"))
        client, owner, project = _polyaxon(cfg, rec)
        uuid = client.create_operation(
            owner, project, parked["operation"], name=parked["run_name"],
            tags=parked.get("tags"), meta=parked.get("meta"), reuse_existing=False)
        raycluster = f"plx-operation-{uuid}"
        new = {k: v for k, v in rec.items() if k != "parked"}
        new.update(polyaxon_uuid=uuid, raycluster=raycluster, resumed_from=parked["stopped_uuid"])
        state.write_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name, new)
        say(progress, f"created Polyaxon run {uuid} from the operation of run {parked['stopped_uuid']}")
        out = KubeResume(name=cfg.name, via=self.via, resumed=True, polyaxon_uuid=uuid, raycluster=raycluster,
                         resumed_from=parked["stopped_uuid"])
        if wait:
            want = next(iter(parked["operation"]["component"]["run"]["workers"].values())).get("replicas", 0)
            out.status = waits.wait_ready(cfg, api, raycluster, want, progress, timeout, ray_check and want > 0)
        return out

    def down(self, cfg: MilesRayConfig) -> KubeDown | DownCluster:
        """Stop and delete the run (and, with Kubernetes access, delete the RayCluster and wait for its pods),
        first saving the runs on it; a cluster already taken down is only shown."""
        saved = teardown.save_runs(cfg)
        down_rec = _taken_down(cfg)
        if down_rec is not None:  # already taken down: say so (Polyaxon's view), nothing to do
            gone = down_status(cfg, down_rec)
            gone.update(already_down=True, saved_runs=saved)
            return gone
        rec = bookkeeping.cluster_record(cfg)
        name = rec["raycluster"]
        out = KubeDown(name=cfg.name, raycluster=name, namespace=cfg.namespace, storage=teardown.STORAGE_KEPT)
        if without_kubectl(cfg, rec):
            was = _stop_run(cfg, rec, out)
            notices = ["no kubeconfig: the Polyaxon run was stopped and deleted; its agent removes the RayCluster "
                       "and pods (not watched from here)"]
            client, owner, project = _polyaxon(cfg, rec)
            try:  # the agent acts on the stop (and reports it) before the run is deleted: see _delete_run
                if was not in NOT_HANDED_TO_THE_AGENT and was not in polyaxon_api.FINAL_STATUSES:
                    client.wait_for_status(owner, project, rec["polyaxon_uuid"], polyaxon_api.FINAL_STATUSES,
                                           AGENT_SECONDS)
            except ClusterError:
                notices.append(f"Polyaxon had not reported run {rec['polyaxon_uuid']} stopped {AGENT_SECONDS:.0f}s "
                               "after the stop: it was deleted anyway; if its RayCluster stays, a Kubernetes admin "
                               "deletes it")
            _delete_run(cfg, rec, out)
            out.update(kubernetes=False, notices=notices)
        else:
            api = bookkeeping.client(cfg)
            if rec.get("polyaxon_uuid"):
                _stop_run(cfg, rec, out)
                remove_polyaxon_made(cfg, api, name, out, agent_seconds=AGENT_SECONDS, timeout=120)
                _delete_run(cfg, rec, out)
            else:
                teardown.delete_raycluster(cfg, api, name, out, wait=True, timeout=120, missing_ok=False)
        _forget(cfg, rec)
        out.saved_runs = saved
        return out
