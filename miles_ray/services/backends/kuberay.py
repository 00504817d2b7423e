"""The KubeRay backend: miles-ray creates the RayCluster itself; parking suspends it (spec.suspend: KubeRay deletes
its pods, the object, claims and checkpoints stay)."""

from __future__ import annotations

import time
from typing import Any

from miles_ray.adapters import kube, state
from miles_ray.core.builders import REDIS_PROBE_PREFIX, kuberay_token_secret, redis_probe_pod
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError, Conflict, TimedOut
from miles_ray.core.prepare import ClusterDocuments
from miles_ray.core.progress import Progress, say
from miles_ray.services import k8s_clusters
from miles_ray.services.backends.drift import refuse_drift
from miles_ray.services.backends.idle import park_gate
from miles_ray.services.backends.kube import bookkeeping, preflight, scaling, status, teardown, waits
from miles_ray.services.backends.results import KubeDown, KubeResume, KubeScale, KubeStatus, KubeUp, ParkResult

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DOWN_GCS_FT_TIMEOUT = 420.0  # down's wait for a GCS fault-tolerant RayCluster (KubeRay's Redis cleanup Job)
GCS_FT_PROBE_TIMEOUT = 300.0  # at most this long for the Redis probe pod (its image may have to be pulled first)


def check_gcs_ft(cfg: MilesRayConfig, api, image: str, progress: Progress, probe: bool, timeout: float) -> str:
    """``gcs_ft``'s preflight, before the RayCluster is created: the password's Secret exists with its key (else the
    head could not start: CreateContainerConfigError), and (``probe``) the Redis answers FROM THE CLUSTER: a
    short-lived pod in the cluster's namespace, in the pinned image, sends AUTH + PING and prints one line; it is
    deleted afterwards. Each failure is one line, exit 2, nothing created. Returns what was checked."""
    address = cfg.gcs_ft or ""
    password = cfg.gcs_ft_password
    if password is not None:
        secret, key = password
        has = kube.secret_has_key(api, cfg.namespace, secret, key)
        if not has:
            what = "does not exist" if has is None else f"has no key {key!r} (or it is empty)"
            raise ConfigError(f"the Redis password Secret {cfg.namespace}/{secret} {what}: the head reads "
                              f"{address}'s password from it (key {key}); nothing was created",
                              hint=f"create it: kubectl -n {cfg.namespace} create secret generic {secret} "
                                   f"--from-literal={key}=<the Redis password>, or pass --gcs-ft-password-secret "
                                   "NAME[:KEY] of an existing one")
    if not probe:
        return f"{address}: password Secret checked; not probed (dry run: no probe pod is created)"
    name = f"{cfg.name[:40]}-redis-probe-{time.time_ns() % 100000:05d}"
    say(progress, f"preflight: probing {address} from namespace {cfg.namespace} (pod {name})")
    phase, log = kube.run_pod_once(api, redis_probe_pod(cfg, image, name), min(timeout, GCS_FT_PROBE_TIMEOUT),
                                   lambda why: say(progress, f"preflight: Redis probe pod {name}: {why}"))
    answer = next((ln for ln in reversed(log.splitlines()) if ln.startswith(REDIS_PROBE_PREFIX + " ")), "")
    if answer.startswith(f"{REDIS_PROBE_PREFIX} ok"):
        return f"{address} answered from namespace {cfg.namespace} ({answer.split(' ', 2)[2]})"
    why = answer.split(" ", 2)[2] if answer.startswith(f"{REDIS_PROBE_PREFIX} fail ") else (
        f"the probe pod ended {phase}" + (f": {log.strip().splitlines()[-1][:200]}" if log.strip() else ""))
    raise ConfigError(f"the GCS fault-tolerance Redis {address} does not answer from namespace {cfg.namespace}: "
                      f"{why}; nothing was created",
                      hint="check the address (a Service the pods resolve, e.g. redis.NS.svc.cluster.local:6379), that "
                           "Redis runs and NetworkPolicies let the namespace reach it, and the password's Secret")


def refuse_kueue(rc: dict[str, Any]) -> None:
    """Kueue owns spec.suspend of a RayCluster it admits: park and resume never toggle it there."""
    queue = ((rc.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if queue:
        name = rc["metadata"]["name"]
        raise Conflict(f"Kueue admits RayCluster {name} (queue {queue!r}) and owns its spec.suspend; miles-ray never "
                       "toggles it under Kueue", hint="'miles-ray down' frees its quota (storage and checkpoints are "
                                                      "kept); or deactivate its Workload with Kueue (spec.active: false)")


def refuse_changed(cfg: MilesRayConfig, existing: dict, wanted: dict, prefix: str) -> None:
    """Refuse (exit 2) an 'up' whose RayCluster differs from the live one, naming the fix (as the local backend
    does: :func:`miles_ray.services.backends.drift.refuse_drift`)."""
    diffs = drift(existing, wanted)
    replicas = ((existing.get("spec") or {}).get("workerGroupSpecs") or [{}])[0].get("replicas")
    nodes_differ = any(d.startswith("replicas") for d in diffs)
    refuse_drift(f"{prefix} RayCluster {cfg.namespace}/{cfg.name}", diffs, live_nodes=replicas if nodes_differ else None,
                 scale_to=cfg.nodes if nodes_differ else None, rest_differs=len(diffs) > int(nodes_differ))


def drift(existing: dict, wanted: dict) -> list[str]:
    """How a live RayCluster differs from the one 'up' would create (what 'up' cannot change in place)."""
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

    def gpus(group: dict) -> str | None:
        try:
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        except (KeyError, IndexError, TypeError):
            return None
        return next((str(v) for k, v in (limits or {}).items() if k.endswith("/gpu")), None)

    if gpus(eg) != gpus(wg):
        diffs.append(f"GPUs per worker {gpus(eg)} != {gpus(wg)}")
    if es.get("gcsFaultToleranceOptions") != ws.get("gcsFaultToleranceOptions"):
        def ft(spec: dict) -> str:
            return (spec.get("gcsFaultToleranceOptions") or {}).get("redisAddress") or "none"
        diffs.append(f"GCS fault tolerance {ft(es)} != {ft(ws)}"
                     if ft(es) != ft(ws) else "GCS fault tolerance's Redis password Secret differs")
    return diffs


class KubeRayBackend:
    name = "kubernetes"
    on_this_machine = False
    via = "kuberay"

    def up(self, cfg: MilesRayConfig, *, progress: Progress = None, timeout: float = 600, dry_run: str | None = None,
           wait: bool = True, ray_check: bool = True) -> KubeUp:
        return k8s_clusters.up(cfg, self, progress=progress, timeout=timeout, dry_run=dry_run, wait=wait,
                               ray_check=ray_check)

    def create(self, cfg: MilesRayConfig, objects: ClusterDocuments, progress: Progress, timeout: float,
               dry_run: str | None, wait: bool, ray_check: bool) -> KubeUp:
        """After the preflight, create the RayCluster (idempotent by name: one that exists with this spec is only
        waited for) and (``wait``) wait until every GPU worker has joined Ray."""
        rc = objects.raycluster or {}
        api = bookkeeping.client(cfg)
        rays = kube.RayClusters(api)
        existing = rays.get(cfg.namespace, cfg.name)
        say(progress, f"preflight: namespace {cfg.namespace}, KubeRay CRD, {cfg.nodes} GPU node(s) x {cfg.gpus_per_node}")
        report = preflight.preflight(cfg, api, cfg.nodes, True, reconciling=existing is not None, rendered=rc)
        if cfg.gcs_ft and existing is None:  # an existing cluster is only waited for (a changed one is refused)
            report.gcs_ft = check_gcs_ft(cfg, api, objects.image, progress, probe=not dry_run, timeout=timeout)
        result = KubeUp(name=cfg.name, namespace=cfg.namespace, via=self.via, preflight=report,
                        warnings=objects.warnings)
        if dry_run:  # the server dry run ('client' is k8s_clusters.up's: nothing contacted)
            rays.create(rc, dry_run=True)
            result.update(dry_run=dry_run, created=False, raycluster=rc)
            return result
        if existing is not None:
            refuse_changed(cfg, existing, rc, "the")
            say(progress, f"RayCluster {cfg.name} already exists with this spec; waiting for it")
            result.created = False
        else:
            try:
                rays.create(rc)
                result.created = True
                say(progress, f"created RayCluster {cfg.namespace}/{cfg.name}")
            except Conflict:
                result.created = False
                # another 'up' of the same name won the race: reconcile with what it created
                raced = rays.get(cfg.namespace, cfg.name)
                diffs = drift(raced, rc) if raced is not None else []
                if diffs:
                    raise Conflict(f"RayCluster {cfg.namespace}/{cfg.name} was just created by someone else and "
                                   "differs: " + "; ".join(diffs), hint="'miles-ray status' shows it") from None
                say(progress, f"RayCluster {cfg.name} already exists (created by a concurrent 'up' meanwhile); "
                              "waiting for it")
        bookkeeping.save_record(cfg, {"name": cfg.name, "via": self.via, "raycluster": cfg.name,
                                      "namespace": cfg.namespace, "context": cfg.kube_context},
                                cfg.ray_auth_secret or kuberay_token_secret(cfg.name))
        if wait:
            result.status = waits.wait_ready(cfg, api, cfg.name, cfg.nodes, progress, timeout, ray_check)
        return result

    def status(self, cfg: MilesRayConfig, *, with_ray: bool = False) -> KubeStatus:
        st = status.raycluster_status(cfg, bookkeeping.client(cfg), bookkeeping.cluster_record(cfg)["raycluster"],
                                      with_ray)
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
        """Suspend the RayCluster (refused when Kueue admits it) and (``wait``) wait until its pods are gone."""
        name = bookkeeping.cluster_record(cfg)["raycluster"]
        api = bookkeeping.client(cfg)
        rays = kube.RayClusters(api)
        rc = bookkeeping.get_raycluster(api, cfg, name)
        refuse_kueue(rc)
        out = ParkResult(name=cfg.name, raycluster=name, namespace=cfg.namespace, parked=True)
        if rc["spec"].get("suspend") is True:
            out.already_parked = True
            return out
        skip, report = park_gate(cfg, if_idle_for, force, lambda: teardown.cluster_idle(cfg),
                                 scaling.guarded(cfg, name))
        if skip:
            return skip
        if report:
            out.idle = report
        if state.list_records():
            out.saved_runs = teardown.save_runs(cfg)
        rays.json_patch(cfg.namespace, name, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/spec/suspend", "value": True}])
        say(progress, f"suspended RayCluster {cfg.namespace}/{name}; KubeRay deletes its pods (the object, claims "
                      "and checkpoints stay)")
        if wait:
            deadline = time.monotonic() + timeout
            while pods := kube.cluster_pods(api, cfg.namespace, name):
                if time.monotonic() > deadline:
                    raise TimedOut(f"RayCluster {name} is suspended but {len(pods)} pod(s) are still there after "
                                   f"{timeout:.0f}s", hint="'miles-ray status' shows them; 'miles-ray park' again waits")
                say(progress, f"waiting for {len(pods)} pod(s) to go")
                time.sleep(waits.POLL)
        return out

    def resume(self, cfg: MilesRayConfig, *, wait: bool = True, ray_check: bool = True, timeout: float = 600,
               progress: Progress = None) -> KubeResume:
        """Clear spec.suspend and (``wait``) wait until every GPU worker has rejoined Ray."""
        name = bookkeeping.cluster_record(cfg)["raycluster"]
        api = bookkeeping.client(cfg)
        rays = kube.RayClusters(api)
        rc = bookkeeping.get_raycluster(api, cfg, name)
        refuse_kueue(rc)
        out = KubeResume(name=cfg.name, raycluster=name, namespace=cfg.namespace)
        groups = rc["spec"].get("workerGroupSpecs") or []
        want = next((g.get("replicas", 0) for g in groups if g.get("groupName") == cfg.worker_group), None)
        if want is None:
            raise ConfigError(f"RayCluster {name} has no worker group {cfg.worker_group!r}",
                              hint="set worker_group in the config")
        out.resumed = rc["spec"].get("suspend") is True
        if out.resumed:
            rays.json_patch(cfg.namespace, name, [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
                {"op": "replace", "path": "/spec/suspend", "value": False}])
            say(progress, f"unsuspended RayCluster {cfg.namespace}/{name}; waiting for {want} GPU worker(s)")
        else:
            out.reason = "it was not parked"
        if wait:
            out.status = waits.wait_ready(cfg, api, name, want, progress, timeout, ray_check and want > 0)
        return out

    def down(self, cfg: MilesRayConfig) -> KubeDown:
        """Delete the RayCluster (first saving the runs on it); storage and checkpoints are never touched."""
        recorded = state.read_json(state.kube_cluster_path(cfg.kube_context, cfg.namespace, cfg.name)) is not None
        name = bookkeeping.cluster_record(cfg)["raycluster"]
        out = KubeDown(name=cfg.name, raycluster=name, namespace=cfg.namespace, storage=teardown.STORAGE_KEPT)
        if not recorded and cfg.kubeconfig is None and kube.missing_kubeconfig(None):
            # nothing on this machine made it and there is no Kubernetes to look in (no kubeconfig at all; one
            # named with --kubeconfig that does not exist stays an error): nothing to take down
            out.update(kubernetes=False, already_down=True)
            return out
        saved = teardown.save_runs(cfg)
        api = bookkeeping.client(cfg)
        live = kube.RayClusters(api).get(cfg.namespace, name) or {}
        # With GCS fault tolerance KubeRay's finalizer first deletes the pods and waits for the head's to go, then
        # empties the Redis with a Job (in the Ray image, 200m CPU, at most 300 s) before the RayCluster goes. That
        # Job is the RayCluster's dependent and reads the cluster's Secrets: a foreground deletion would have the
        # garbage collector delete it (and the token Secret) again and again until KubeRay gives up after 300 s,
        # leaving Ray's state in the Redis. So such a cluster is deleted in the background.
        ft = bool((live.get("spec") or {}).get("gcsFaultToleranceOptions"))
        teardown.delete_raycluster(cfg, api, name, out, wait=True, timeout=DOWN_GCS_FT_TIMEOUT if ft else 120,
                                   missing_ok=True, propagation="Background" if ft else "Foreground")
        state.remove_kube_cluster(cfg.kube_context, cfg.namespace, cfg.name)
        if not out.deleted:
            out.already_down = True
        out.saved_runs = saved
        return out
