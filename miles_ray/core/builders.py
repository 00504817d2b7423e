"""Builders for what miles-ray creates: a Polyaxon ``raycluster`` operation and a KubeRay RayCluster.

Both are generated from ONE container spec (``ray_container``): the same image reference, the same
environment and the same mounts on the head and every worker. Head and workers differ only in their
resources and ``rayStartParams`` (and pod-level GPU placement: node selector and tolerations).
Ray token authentication (``ray_auth``) is rendered by :func:`ray_auth` alone. Pure functions: dicts in, dicts out.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.names import label_safe
from miles_ray.core.planner import Plan

MANAGED_BY = "miles-ray"
POLYAXON_VERSION = 1.1
HEAD_START_PARAMS = {"num-gpus": "0", "num-cpus": "0", "dashboard-host": "0.0.0.0"}


def miles_env(cfg: MilesRayConfig) -> dict[str, str]:
    """Environment every Ray process and the job gets. User env cannot override the safety values."""
    env = dict(cfg.env)
    env.update({
        "MILES_SCRIPT_EXTERNAL_RAY": "1",
        # Kubernetes injects PROMETHEUS_PORT=tcp://... when a Service named prometheus exists.
        "PROMETHEUS_PORT": "9090",
        # Probed with nvidia-smi on the submitter by the launcher (0 on a GPU-less pod): set explicitly.
        "NCCL_NVLS_ENABLE": cfg.nccl_nvls_enable,
        "PYTHONUNBUFFERED": "1",
        # Every fake or real node would watch host memory; Miles users commonly disable the monitor.
        "RAY_memory_monitor_refresh_ms": "0",
    })
    return dict(sorted(env.items()))


def secret_env_refs(cfg: MilesRayConfig) -> list[dict[str, Any]]:
    """``secret_env`` as Kubernetes ``env[].valueFrom.secretKeyRef`` entries: the pod reads the credential
    from the Secret at start; no spec, record or log ever holds its value."""
    refs = []
    for env_name, ref in sorted(cfg.secret_env.items()):
        secret, _, key = ref.partition("/")
        refs.append({"name": env_name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return refs


RAY_TOKEN_KEY = "auth_token"  # the key of the token in its Secret (KubeRay's name for it)
KUBERAY_NAME_MAX = 50  # KubeRay shortens longer RayCluster names to their last 50 characters for what it creates


def kuberay_token_secret(raycluster: str) -> str:
    """The Secret KubeRay (>= 1.6) creates for a RayCluster with ``authOptions.mode: token`` and no
    ``secretName``: named after the RayCluster as KubeRay names the objects it makes (its last 50 characters,
    an 'r' in place of a leading digit or punctuation)."""
    name = raycluster[-KUBERAY_NAME_MAX:]
    if name and not name[0].isalpha():
        name = "r" + name[1:]
    return name


def ray_token_secret(cfg: MilesRayConfig) -> str:
    """The Secret holding the cluster's Ray token under :data:`RAY_TOKEN_KEY`: ``ray_auth_secret``, else the one
    KubeRay creates for the RayCluster ``up --via kuberay`` makes (named after the cluster)."""
    return cfg.ray_auth_secret or kuberay_token_secret(cfg.name)


def token_secret_of(cfg: MilesRayConfig, raycluster: str, via: str | None, recorded: str | None = None) -> str:
    """The Secret holding the Ray token of RayCluster ``raycluster`` as miles-ray made it (no cluster read):
    the Secret ``up`` recorded, else ``ray_auth_secret``, else for a Polyaxon-made cluster (``via`` polyaxon:
    its RayCluster is ``plx-operation-<uuid>``, rendered by Polyaxon without ``authOptions``, so KubeRay makes
    no Secret for it) the one named after the miles-ray cluster that the operation references, and for any
    other RayCluster the one KubeRay makes, named after that RayCluster."""
    if recorded:
        return recorded
    if cfg.ray_auth_secret:
        return cfg.ray_auth_secret
    return kuberay_token_secret(cfg.name if via == "polyaxon" else raycluster)


def ray_auth_env(mode: str, secret: str | None) -> list[dict[str, Any]]:
    """The container env of a Ray process or ``ray`` client that is not under KubeRay's ``authOptions``:
    ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` by reference to ``secret`` (never the value), or
    ``RAY_AUTH_MODE=disabled``."""
    if mode != "token":
        return [{"name": "RAY_AUTH_MODE", "value": "disabled"}]
    return [{"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": RAY_TOKEN_KEY}}}]


def ray_auth(cfg: MilesRayConfig, *, kuberay_managed: bool) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Ray token authentication as rendered: ``(spec.authOptions or None, env entries for the container)``.

    * ``ray_auth: token`` on a RayCluster KubeRay manages (``kuberay_managed``): ``authOptions: {mode: token}``
      (KubeRay >= 1.6; plus ``secretName`` with ``ray_auth_secret``). The operator then creates the token
      Secret (unless named), sets ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` (from the Secret) on every Ray container
      and on its init containers, and authenticates its own calls to the head. No env here.
    * ``token`` elsewhere (the Polyaxon operation's head and workers, whose RayCluster Polyaxon renders without
      ``authOptions``; the in-cluster launcher job): ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` by
      reference to the Secret (``secretKeyRef``), never the value. KubeRay copies the Ray container's env to
      the workers' ``wait-gcs-ready`` init container, so it authenticates too.
    * ``none``: ``RAY_AUTH_MODE=disabled`` explicitly (Ray makes token auth its default in 2.61), no
      ``authOptions`` -- so an operator older than 1.6 accepts the RayCluster.
    """
    if cfg.ray_auth == "token" and kuberay_managed:
        options: dict[str, Any] = {"mode": "token"}
        if cfg.ray_auth_secret:
            options["secretName"] = cfg.ray_auth_secret
        return options, []
    return None, ray_auth_env(cfg.ray_auth, ray_token_secret(cfg))


NO_AUTH_WARNING = ("ray_auth is none: the cluster's Ray head runs without token authentication, so anyone who "
                   "can reach it can run code on every node")


def ray_container(cfg: MilesRayConfig, image: str, with_mounts: bool, kuberay_managed: bool = True) -> dict[str, Any]:
    """The one container spec shared by head and workers (resources are added per role)."""
    container: dict[str, Any] = {
        "name": "ray",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": ([{"name": k, "value": v} for k, v in miles_env(cfg).items()] + secret_env_refs(cfg)
                + ray_auth(cfg, kuberay_managed=kuberay_managed)[1]),
    }
    security = container_security(cfg)
    if security:
        container["securityContext"] = security
    if with_mounts:
        # /dev/shm as a memory-backed volume (NCCL and Ray's object store use it; it counts toward the pod's
        # memory): explicit here rather than left to KubeRay's injection, so the spec says what the pod gets.
        container["volumeMounts"] = [{"name": cfg.claim, "mountPath": cfg.mount_path},
                                     {"name": "shm", "mountPath": "/dev/shm"}]
    return container


def container_security(cfg: MilesRayConfig) -> dict[str, Any] | None:
    """The Ray container's securityContext: none for ``baseline``; for ``restricted`` everything the restricted
    Pod Security Standard asks of a container (also copied by KubeRay to the init container it injects)."""
    if cfg.pod_security != "restricted":
        return None
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
            "runAsUser": cfg.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security_context(cfg: MilesRayConfig) -> dict[str, Any] | None:
    """The pod-level securityContext for ``restricted`` (covers any container the operator adds)."""
    if cfg.pod_security != "restricted":
        return None
    return {"runAsNonRoot": True, "runAsUser": cfg.run_as_user, "runAsGroup": cfg.run_as_user,
            "fsGroup": cfg.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}}


def head_resources(cfg: MilesRayConfig) -> dict[str, dict[str, str]]:
    q = {"cpu": str(cfg.head_cpus), "memory": cfg.head_memory}
    return {"requests": dict(q), "limits": dict(q)}


def worker_resources(cfg: MilesRayConfig) -> dict[str, dict[str, str]]:
    q = {"cpu": str(cfg.cpus_per_node), "memory": cfg.memory_per_node, "nvidia.com/gpu": str(cfg.gpus_per_node)}
    requests = dict(q)
    if cfg.cpu_request_per_node is not None:
        requests["cpu"] = cfg.cpu_request_per_node
    return {"requests": requests, "limits": dict(q)}


def worker_start_params(cfg: MilesRayConfig) -> dict[str, str]:
    return {"num-gpus": str(cfg.gpus_per_node), "num-cpus": str(cfg.cpus_per_node)}


def _with_resources(base: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    c = copy.deepcopy(base)
    c["resources"] = resources
    return c


def gpu_placement(cfg: MilesRayConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cfg.node_selector:
        out["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        out["tolerations"] = [t.model_dump(exclude_none=True) for t in cfg.tolerations]
    return out


def labels(cfg: MilesRayConfig, plan: Plan) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/name": "miles",
        "miles-ray/recipe": label_safe(plan.recipe),
        "miles-ray/layout": plan.layout,
    }


def plan_annotation(plan: Plan, image: str, ray_version: str) -> str:
    return json.dumps({
        "recipe": plan.recipe,
        "recipe_hash": plan.recipe_hash,
        "layout": plan.layout,
        "nodes": plan.nodes,
        "gpus_per_node": plan.gpus_per_node,
        "miles_args": plan.miles_args,
        "image": image,
        "ray_version": ray_version,
    }, sort_keys=True, separators=(",", ":"))


def build_raycluster(cfg: MilesRayConfig, plan: Plan, image: str, ray_version: str) -> dict[str, Any]:
    """A plain KubeRay ``ray.io/v1`` RayCluster (for users without Polyaxon)."""
    base = ray_container(cfg, image, with_mounts=True)
    volumes = [{"name": cfg.claim, "persistentVolumeClaim": {"claimName": cfg.claim}},
               {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    head_pod = {
        "containers": [_with_resources(base, head_resources(cfg))],
        "volumes": copy.deepcopy(volumes),
    }
    worker_pod = {
        "containers": [_with_resources(base, worker_resources(cfg))],
        "volumes": copy.deepcopy(volumes),
        **gpu_placement(cfg),
    }
    pod_security = pod_security_context(cfg)
    if pod_security:
        head_pod["securityContext"] = copy.deepcopy(pod_security)
        worker_pod["securityContext"] = copy.deepcopy(pod_security)
    lbl = labels(cfg, plan)
    doc = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": cfg.name,
            "namespace": cfg.namespace,
            "labels": lbl,
            "annotations": {"miles-ray/plan": plan_annotation(plan, image, ray_version)},
        },
        "spec": {
            "rayVersion": ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "serviceType": "ClusterIP",
                "rayStartParams": dict(HEAD_START_PARAMS),
                "template": {"metadata": {"labels": dict(lbl)}, "spec": head_pod},
            },
            "workerGroupSpecs": [{
                "groupName": cfg.worker_group,
                "replicas": plan.ray.gpu_workers,
                "minReplicas": plan.ray.gpu_workers,
                "maxReplicas": plan.ray.gpu_workers,
                "rayStartParams": worker_start_params(cfg),
                "template": {"metadata": {"labels": dict(lbl)}, "spec": worker_pod},
            }],
        },
    }
    auth_options, _ = ray_auth(cfg, kuberay_managed=True)
    if auth_options is not None:
        doc["spec"]["authOptions"] = auth_options
    gcs_ft = gcs_fault_tolerance(cfg)
    if gcs_ft is not None:
        doc["spec"]["gcsFaultToleranceOptions"] = gcs_ft
    return doc


def gcs_fault_tolerance(cfg: MilesRayConfig) -> dict[str, Any] | None:
    """KubeRay's ``spec.gcsFaultToleranceOptions`` (KubeRay >= 1.3) for ``gcs_ft``, or None: the Redis address
    (HOST:PORT) and its password by reference to the Secret (``valueFrom.secretKeyRef``: never the value). KubeRay
    then gives the head ``RAY_REDIS_ADDRESS`` and the workers a long GCS reconnect timeout, so a lost head's state
    survives in Redis and the workers' raylets reconnect to the new head instead of exiting."""
    address = cfg.gcs_ft_host_port
    if address is None:
        return None
    options: dict[str, Any] = {"redisAddress": f"{address[0]}:{address[1]}"}
    password = cfg.gcs_ft_password
    if password is not None:
        options["redisPassword"] = {"valueFrom": {"secretKeyRef": {"name": password[0], "key": password[1]}}}
    return options


REDIS_PROBE_PREFIX = "REDIS_PROBE"  # the first word of the probe pod's one line of output
# What the probe pod runs (python3, stdlib only): AUTH (when a password is given) and PING against the Redis, a
# few tries within ~15 s (a Service or DNS name that has just been created), then ONE line: "REDIS_PROBE ok ..." or
# "REDIS_PROBE fail <why>". Exit 0 either way: the line is the answer.
REDIS_PROBE_SCRIPT = r"""
import os, socket, time
host, port, pw = os.environ["PROBE_HOST"], int(os.environ["PROBE_PORT"]), os.environ.get("PROBE_PASSWORD")
def cmd(*args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() for x in args))
def line(f):
    got = f.readline(512).decode("utf-8", "replace").strip()
    if not got:
        raise OSError("the server closed the connection")
    return got
why = ""
for attempt in range(4):
    try:
        with socket.create_connection((host, port), timeout=4) as s:
            s.settimeout(4)
            f = s.makefile("rb")
            if pw:
                s.sendall(cmd("AUTH", pw))
                got = line(f)
                if not got.startswith("+OK"):
                    print("REDIS_PROBE fail AUTH answered: " + got[:160], flush=True)
                    raise SystemExit(0)
            s.sendall(cmd("PING"))
            got = line(f)
            if got.startswith("+PONG"):
                print("REDIS_PROBE ok PING answered PONG" + (" after AUTH" if pw else ""), flush=True)
            else:
                print("REDIS_PROBE fail PING answered: " + got[:160], flush=True)
            raise SystemExit(0)
    except (OSError, ValueError) as e:
        why = "%s: %s" % (type(e).__name__, e)
    time.sleep(3)
print("REDIS_PROBE fail no answer from %s:%d (%s)" % (host, port, why[:200]), flush=True)
"""


def redis_probe_pod(cfg: MilesRayConfig, image: str, name: str) -> dict[str, Any]:
    """The short-lived pod preflight runs in the cluster's namespace before creating a RayCluster with ``gcs_ft``:
    the pinned image, :data:`REDIS_PROBE_SCRIPT` with the address, the password by reference to its Secret, small
    requests, no restarts; the pod security of the Ray pods."""
    host, port = cfg.gcs_ft_host_port or ("", 0)
    env: list[dict[str, Any]] = [{"name": "PROBE_HOST", "value": host}, {"name": "PROBE_PORT", "value": str(port)}]
    password = cfg.gcs_ft_password
    if password is not None:
        env.append({"name": "PROBE_PASSWORD", "valueFrom": {"secretKeyRef": {"name": password[0], "key": password[1]}}})
    small = {"cpu": "100m", "memory": "64Mi"}
    container: dict[str, Any] = {"name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["python3", "-c", REDIS_PROBE_SCRIPT], "env": env,
                                 "resources": {"requests": dict(small), "limits": dict(small)}}
    security = container_security(cfg)
    if security:
        container["securityContext"] = security
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "terminationGracePeriodSeconds": 0,
                            "automountServiceAccountToken": False}
    pod_security = pod_security_context(cfg)
    if pod_security:
        spec["securityContext"] = pod_security
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": cfg.namespace,
                         "labels": {"app.kubernetes.io/managed-by": MANAGED_BY,
                                    "app.kubernetes.io/name": "miles-ray-redis-probe", "miles-ray/cluster": cfg.name}},
            "spec": spec}


def build_operation(cfg: MilesRayConfig, plan: Plan, image: str, ray_version: str,
                    tags: list[str] | None = None) -> dict[str, Any]:
    """A Polyaxon ``kind: operation`` whose component runs ``kind: raycluster``.

    Head and workers each get their own container, connections and environment in Polyaxon's schema;
    here they are copies of one spec so they cannot drift.
    """
    base = ray_container(cfg, image, with_mounts=False, kuberay_managed=False)
    connections = [cfg.connection]
    head: dict[str, Any] = {
        "rayStartParams": dict(HEAD_START_PARAMS),
        "connections": list(connections),
        "container": _with_resources(base, head_resources(cfg)),
    }
    worker: dict[str, Any] = {
        "replicas": plan.ray.gpu_workers,
        "minReplicas": plan.ray.gpu_workers,
        "maxReplicas": plan.ray.gpu_workers,
        "rayStartParams": worker_start_params(cfg),
        "connections": list(connections),
        "container": _with_resources(base, worker_resources(cfg)),
    }
    placement = gpu_placement(cfg)
    if placement:
        worker["environment"] = placement
    # restricted: the container securityContext above; Polyaxon's environment.securityContext is a container-level
    # type (no fsGroup), so no pod-level one is set on this path.
    component: dict[str, Any] = {
        "version": POLYAXON_VERSION,
        "kind": "component",
        "name": cfg.name,
        "description": f"Miles {plan.recipe} on {plan.nodes} x {plan.gpus_per_node} GPUs ({plan.layout}), by miles-ray",
        "tags": ["miles-ray", label_safe(plan.recipe)],
        "plugins": {"shm": True},
        "run": {
            "kind": "raycluster",
            "rayVersion": ray_version,
            "head": head,
            "workers": {cfg.worker_group: worker},
        },
    }
    op: dict[str, Any] = {
        "version": POLYAXON_VERSION,
        "kind": "operation",
        "name": cfg.name,
        "tags": sorted({"miles-ray", label_safe(plan.recipe), *(tags or [])}),
        "component": component,
    }
    if cfg.polyaxon_preset:
        op["presets"] = [cfg.polyaxon_preset]
    return op
