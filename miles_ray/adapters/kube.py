"""Kubernetes adapter: API client loading, a thin RayCluster layer over ``CustomObjectsApi`` that raises
real errors, capacity preflight, pods (summarised, or the raw objects for diagnosis), quotas, services and
port-forwarding to the Ray head.

The upstream KubeRay Python client is not on PyPI and swallows errors; this one turns every Kubernetes
failure into one typed error (:mod:`miles_ray.core.errors`: ``NotFound``, ``Conflict``, ``Forbidden``,
``Invalid``, ``Unreachable`` ...) with one clear line (what failed, on what, why), chosen from the HTTP status
or the exception type, never from the message text.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from miles_ray.core.errors import ClusterError, ConfigError, Conflict, Invalid, NotFound, Unreachable, from_http_status

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
CRD_NAME = "rayclusters.ray.io"
GPU = "nvidia.com/gpu"
CONFLICT_RETRIES = 6


# -- client and errors --------------------------------------------------------------------------

def missing_kubeconfig(kubeconfig: str | None = None) -> str | None:
    """The kubeconfig path :func:`load_client` would read when that file does not exist and no in-cluster
    config stands in (a Polyaxon user without kubectl access); None when Kubernetes can be configured."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path is None and not Path("~/.kube/config").expanduser().exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    path = str(Path(path or "~/.kube/config").expanduser())
    return None if Path(path).is_file() else path


def load_client(kubeconfig: str | None = None, context: str | None = None):
    """An ApiClient for the kubeconfig/context (kubectl's rules), or in-cluster config inside a pod."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path is None and not Path("~/.kube/config").expanduser().exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except ConfigException as e:
            raise Unreachable(f"in-cluster Kubernetes config failed: {e}") from None
    path = str(Path(path or "~/.kube/config").expanduser())
    if not Path(path).is_file():
        raise ConfigError(f"kubeconfig {path} does not exist",
                          hint="pass --kubeconfig, set KUBECONFIG, or use --backend local for the embedded cluster")
    try:
        return config.new_client_from_config(config_file=path, context=context)
    except ConfigException as e:
        msg = str(e).splitlines()[0]
        if context and "context" in msg.lower():
            raise ConfigError(f"context {context!r} is not in kubeconfig {path}",
                              hint="'kubectl config get-contexts' lists them") from None
        raise ConfigError(f"kubeconfig {path} is unusable: {msg}") from None
    except (ValueError, TypeError, OSError) as e:
        raise ConfigError(f"kubeconfig {path} is unusable: {e}") from None


def api_error(e: BaseException, action: str) -> ClusterError:
    """The typed error for a kubernetes client/urllib3 exception: by HTTP status (403 Forbidden, 404 NotFound,
    409 Conflict, 400/422 Invalid, 5xx/429 Unreachable), or Unreachable when the API did not answer."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException) and e.status:
        reason = e.reason or ""
        try:
            body = json.loads(e.body or "{}")
            reason = body.get("message") or reason
        except (ValueError, TypeError, AttributeError):
            pass
        if e.status == 403:
            return from_http_status(403, f"forbidden: {action}: {reason}",
                                    "your identity lacks this permission; manifests/rbac.yaml lists every permission "
                                    "that miles-ray asks for")
        if e.status == 401:
            return from_http_status(401, f"unauthorized: {action}: the cluster rejected the credentials in the "
                                         "kubeconfig")
        return from_http_status(e.status, f"{action} failed: HTTP {e.status}: {reason}")
    detail = (e.reason if isinstance(e, ApiException) else str(e)) or type(e).__name__
    return Unreachable(f"{action} failed: the Kubernetes API is unreachable ({type(e).__name__}: "
                       f"{str(detail).splitlines()[0][:200]})", hint="check the kubeconfig server and your network")


def _status(e: BaseException) -> int | None:
    return getattr(e, "status", None)


# -- the thin RayCluster layer ------------------------------------------------------------------

class RayClusters:
    """create/get/list/patch/delete of ``ray.io/v1`` RayClusters, raising typed errors (see :func:`api_error`)."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)

    def get(self, namespace: str, name: str) -> dict | None:
        try:
            return self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except Exception as e:  # noqa: BLE001 - mapped to a typed error
            if _status(e) == 404:
                return None
            raise api_error(e, f"get RayCluster {namespace}/{name}") from None

    def list(self, namespace: str, label_selector: str = "") -> list[dict]:
        try:
            return self.api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                          label_selector=label_selector)["items"]
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"list RayClusters in {namespace}") from None

    def create(self, body: dict, dry_run: bool = False) -> dict:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        kwargs = {"dry_run": "All"} if dry_run else {}
        try:
            return self.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body,
                                                            field_validation="Strict", **kwargs)
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"create RayCluster {ns}/{name}{' (server dry run)' if dry_run else ''}") from None

    def delete(self, namespace: str, name: str) -> bool:
        try:
            self.api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                     propagation_policy="Foreground")
            return True
        except Exception as e:  # noqa: BLE001
            if _status(e) == 404:
                return False
            raise api_error(e, f"delete RayCluster {namespace}/{name}") from None

    def json_patch(self, namespace: str, name: str, ops: list[dict]) -> dict:
        try:
            return self.api.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, ops, _content_type="application/json-patch+json")
        except Exception as e:  # noqa: BLE001
            raise api_error(e, f"patch RayCluster {namespace}/{name}") from None

    def set_replicas(self, namespace: str, name: str, group: str, replicas: int,
                     on_retry: Callable[[str], None] | None = None) -> tuple[dict, list[str]]:
        """Set a worker group's replicas with a JSON patch guarded by ``test`` ops on the group name and the
        resourceVersion; min/max replicas are moved explicitly (KubeRay would clamp silently). Retries on
        conflict with fresh state. Returns the patched object and the notes on what else changed."""
        last: ClusterError | None = None
        for attempt in range(CONFLICT_RETRIES):
            rc = self.get(namespace, name)
            if rc is None:
                raise NotFound(f"RayCluster {namespace}/{name} does not exist",
                               hint="'miles-ray status' lists what is there; create it with 'miles-ray up'")
            groups = rc.get("spec", {}).get("workerGroupSpecs") or []
            index = next((i for i, g in enumerate(groups) if g.get("groupName") == group), None)
            if index is None:
                names = ", ".join(g.get("groupName", "?") for g in groups) or "none"
                raise ConfigError(f"RayCluster {name} has no worker group {group!r} (groups: {names})",
                                  hint="pass the group with --worker-group or set worker_group in the config")
            g = groups[index]
            base = f"/spec/workerGroupSpecs/{index}"
            ops: list[dict] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rc["metadata"]["resourceVersion"]},
                {"op": "test", "path": f"{base}/groupName", "value": group},
                {"op": "replace" if "replicas" in g else "add", "path": f"{base}/replicas", "value": replicas},
            ]
            notes: list[str] = []
            if g.get("maxReplicas") is not None and replicas > g["maxReplicas"]:
                ops.append({"op": "replace", "path": f"{base}/maxReplicas", "value": replicas})
                notes.append(f"maxReplicas {g['maxReplicas']} -> {replicas}")
            if g.get("minReplicas") is not None and replicas < g["minReplicas"]:
                ops.append({"op": "replace", "path": f"{base}/minReplicas", "value": replicas})
                notes.append(f"minReplicas {g['minReplicas']} -> {replicas}")
            try:
                return self.json_patch(namespace, name, ops), notes
            except (Conflict, Invalid) as e:  # a guarding 'test' op failed (422) or a lost race (409)
                if attempt + 1 < CONFLICT_RETRIES:
                    last = e
                    if on_retry:
                        on_retry(f"RayCluster changed while scaling (HTTP {e.status}); retrying on fresh state")
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise
        raise last or Conflict(f"scaling RayCluster {namespace}/{name} failed after {CONFLICT_RETRIES} attempts")


# -- preflight ----------------------------------------------------------------------------------

def namespace_exists(api_client, namespace: str) -> bool:
    from kubernetes import client

    try:
        client.CoreV1Api(api_client).read_namespace(namespace)
        return True
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return False
        raise api_error(e, f"read namespace {namespace}") from None


def read_crd(api_client, crd_name: str) -> dict | None:
    """The installed CRD ``crd_name`` as plain JSON (camelCase keys, as stored), or None when it is not installed."""
    from kubernetes import client

    try:
        crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(crd_name)
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return None
        raise api_error(e, f"read CRD {crd_name}") from None
    return api_client.sanitize_for_serialization(crd)


def raycluster_crd(api_client) -> dict | None:
    """The installed RayCluster CRD (see :func:`read_crd`), or None when it is not installed."""
    return read_crd(api_client, CRD_NAME)


def crd_served_versions(crd: dict) -> list[str]:
    return [v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("served")]


def crd_schema(crd: dict, version: str = VERSION) -> dict | None:
    """The ``openAPIV3Schema`` of one version of a CRD (as :func:`raycluster_crd` returns it), if it has one."""
    for v in crd.get("spec", {}).get("versions", []):
        if v.get("name") == version:
            return (v.get("schema") or {}).get("openAPIV3Schema")
    return None


def raycluster_crd_versions(api_client) -> list[str] | None:
    """Served versions of the RayCluster CRD, or None when it is not installed."""
    crd = raycluster_crd(api_client)
    return None if crd is None else crd_served_versions(crd)


def pvc_exists(api_client, namespace: str, claim: str) -> bool:
    from kubernetes import client

    try:
        client.CoreV1Api(api_client).read_namespaced_persistent_volume_claim(claim, namespace)
        return True
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return False
        raise api_error(e, f"read PersistentVolumeClaim {namespace}/{claim}") from None


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3}


def quantity(value: Any) -> float:
    s = str(value).strip()
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if s.endswith(suf):
            return float(s[: -len(suf)]) * _SUFFIX[suf]
    return float(s)


def _tolerates(taint: dict, tolerations: list[dict]) -> bool:
    if taint.get("effect") == "PreferNoSchedule":
        return True
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


@dataclass
class NodeFit:
    name: str
    gpus_allocatable: float
    gpus_free: float
    cpu_free: float
    memory_free: float
    eligible: bool
    why_not: str = ""


@dataclass
class Capacity:
    nodes: list[NodeFit] = field(default_factory=list)

    def fitting(self, gpus: int, cpu: float, memory: float) -> list[NodeFit]:
        return [n for n in self.nodes if n.eligible and n.gpus_free >= gpus and n.cpu_free >= cpu
                and n.memory_free >= memory]


def gpu_capacity(api_client, node_selector: dict[str, str], tolerations: list[dict]) -> Capacity:
    """Per GPU node: allocatable minus what running/pending pods already request."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    try:
        nodes = core.list_node().items
        pods = core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, "list nodes and pods") from None
    used: dict[str, dict[str, float]] = {}
    for p in pods:
        node = p.spec.node_name
        if not node:
            continue
        acc = used.setdefault(node, {"gpu": 0.0, "cpu": 0.0, "memory": 0.0})
        for c in p.spec.containers or []:
            req = (c.resources.requests or {}) if c.resources else {}
            acc["gpu"] += quantity(req.get(GPU, 0))
            acc["cpu"] += quantity(req.get("cpu", 0))
            acc["memory"] += quantity(req.get("memory", 0))
    cap = Capacity()
    for n in nodes:
        alloc = n.status.allocatable or {}
        gpus = quantity(alloc.get(GPU, 0))
        if gpus <= 0:
            continue
        u = used.get(n.metadata.name, {"gpu": 0.0, "cpu": 0.0, "memory": 0.0})
        labels = n.metadata.labels or {}
        why = ""
        if any(labels.get(k) != v for k, v in node_selector.items()):
            why = "node selector does not match"
        elif n.spec.unschedulable:
            why = "cordoned"
        else:
            taints = [t.to_dict() for t in (n.spec.taints or [])]
            untolerated = [t for t in taints if not _tolerates(t, tolerations)]
            if untolerated:
                why = f"taint {untolerated[0]['key']}:{untolerated[0]['effect']} not tolerated"
            ready = [c for c in (n.status.conditions or []) if c.type == "Ready"]
            if not why and (not ready or ready[0].status != "True"):
                why = "not Ready"
        cap.nodes.append(NodeFit(
            name=n.metadata.name, gpus_allocatable=gpus, gpus_free=gpus - u["gpu"],
            cpu_free=quantity(alloc.get("cpu", 0)) - u["cpu"], memory_free=quantity(alloc.get("memory", 0)) - u["memory"],
            eligible=not why, why_not=why))
    return cap


# -- pods, quotas, services ---------------------------------------------------------------------

FATAL_WAITING = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError",
                 "InvalidImageName", "CreateContainerError", "RunContainerError"}
# A container that crashed fewer times than this is still given a chance: a Ray worker exits when its head
# restarts and a slow node can time out Ray's first start, and both recover on the kubelet's next restart
# (10 s, 20 s, 40 s back-off). From the third restart on, CrashLoopBackOff is a verdict, not a hiccup.
CRASHLOOP_RESTARTS = 3


def waiting_is_fatal(reason: str, restart_count: int) -> bool:
    """Whether a container waiting for ``reason`` after ``restart_count`` restarts will not start by itself."""
    if reason == "CrashLoopBackOff":
        return restart_count >= CRASHLOOP_RESTARTS
    return reason in FATAL_WAITING


def list_pods(api_client, namespace: str, label_selector: str = "") -> list[Any]:
    """The raw ``V1Pod`` objects matching ``label_selector`` (for diagnosis that needs every field)."""
    from kubernetes import client

    try:
        return client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=label_selector).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list pods in {namespace}" + (f" ({label_selector})" if label_selector else "")) from None


def cluster_selector(cluster: str, role: str | None = None) -> str:
    """The label selector of a RayCluster's pods (KubeRay labels), optionally only the head or the workers."""
    return f"ray.io/cluster={cluster}" + (f",ray.io/node-type={role}" if role else "")


def list_quotas(api_client, namespace: str) -> list[Any]:
    """The namespace's ``V1ResourceQuota`` objects."""
    from kubernetes import client

    try:
        return client.CoreV1Api(api_client).list_namespaced_resource_quota(namespace).items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list ResourceQuotas in {namespace}") from None


def service_ports(api_client, namespace: str, name: str) -> list[int] | None:
    """The ports of Service ``namespace/name``, or None when it does not exist."""
    from kubernetes import client

    try:
        svc = client.CoreV1Api(api_client).read_namespaced_service(name, namespace)
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return None
        raise api_error(e, f"read Service {namespace}/{name}") from None
    return [p.port for p in (svc.spec.ports or [])]


def cluster_pods(api_client, namespace: str, cluster: str) -> list[dict]:
    """Pods of a RayCluster with phase, node and the reason they are not running (if any)."""
    return pod_rows(list_pods(api_client, namespace, cluster_selector(cluster)))


def pod_rows(pods: list[Any]) -> list[dict]:
    """``cluster_pods``'s rows for pods already listed: phase, node, readiness, IP and why not running."""
    out = []
    for p in pods:
        labels = p.metadata.labels or {}
        reason, message, fatal = "", "", False
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                reason, message = c.reason or "Unschedulable", c.message or ""
        for cs in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason:
                reason, message = waiting.reason, waiting.message or ""
                if waiting.reason == "CrashLoopBackOff":
                    message = f"restarted {cs.restart_count or 0} time(s); {message}"
                fatal = waiting_is_fatal(waiting.reason, cs.restart_count or 0)
        ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        out.append({
            "name": p.metadata.name,
            "role": labels.get("ray.io/node-type", "?"),
            "group": labels.get("ray.io/group", ""),
            "phase": p.status.phase,
            "ready": ready,
            "node": p.spec.node_name,
            "reason": reason,
            "message": message,
            "fatal": fatal or reason == "Unschedulable",
            "deleting": p.metadata.deletion_timestamp is not None,
            "ip": p.status.pod_ip,
        })
    return sorted(out, key=lambda d: (d["role"] != "head", d["name"]))


# -- port-forward to the head -------------------------------------------------------------------

def head_pod(api_client, namespace: str, cluster: str) -> str:
    """The name of the RayCluster's running head pod: NotFound when it has none, Unreachable when it is not
    running (yet)."""
    return running_head_pod(api_client, namespace, cluster).metadata.name


def running_head_pod(api_client, namespace: str, cluster: str) -> Any:
    """The RayCluster's running head pod (``V1Pod``); errors as :func:`head_pod`."""
    pods = list_pods(api_client, namespace, cluster_selector(cluster, "head"))
    if not pods:
        raise NotFound(f"RayCluster {namespace}/{cluster} has no head pod",
                       hint="'miles-ray status' shows what is there; 'miles-ray up' creates it")
    running = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    if not running:
        states = ", ".join(f"{p.metadata.name} {p.status.phase}" for p in pods)
        raise Unreachable(f"the head pod of RayCluster {namespace}/{cluster} is not running ({states})",
                          hint="'miles-ray status' shows why; 'miles-ray up' waits for it")
    return running[0]


TOKEN_RBAC_HINT = ("the Ray token is read from that Secret: your identity needs 'get' on secrets in the namespace "
                   "(manifests/rbac.yaml)")


def head_ray_token(api_client, namespace: str, cluster: str, pod: Any) -> str | None:
    """The Ray token the head pod runs with, or None when its Ray container (the first) does not run with
    ``RAY_AUTH_MODE=token``. KubeRay's ``authOptions`` (and the Polyaxon path's env) give that container
    ``RAY_AUTH_TOKEN`` from a Secret: that Secret is read here (``get`` on one Secret, nothing listed). The token
    is returned, never logged or put into an error."""
    import base64

    from kubernetes import client

    container = (pod.spec.containers or [None])[0]
    env = {e.name: e for e in (getattr(container, "env", None) or [])}
    mode = env.get("RAY_AUTH_MODE")
    if mode is None or (mode.value or "").strip().lower() != "token":
        return None
    where = f"RayCluster {namespace}/{cluster} (head pod {pod.metadata.name})"
    var = env.get("RAY_AUTH_TOKEN")
    if var is not None and var.value:
        return var.value.strip()
    ref = getattr(getattr(var, "value_from", None), "secret_key_ref", None) if var is not None else None
    if ref is None or not ref.name or not ref.key:
        raise ClusterError(f"{where} runs with RAY_AUTH_MODE=token but its RAY_AUTH_TOKEN is not taken from a "
                           "Secret (secretKeyRef)", hint="set RAY_AUTH_TOKEN from a Secret on the head's Ray container")
    try:
        secret = client.CoreV1Api(api_client).read_namespaced_secret(ref.name, namespace)
    except Exception as e:  # noqa: BLE001
        error = api_error(e, f"read the Ray token Secret {namespace}/{ref.name} of {where}")
        if _status(e) == 403:
            error.hint = TOKEN_RBAC_HINT
        raise error from None
    raw = (secret.data or {}).get(ref.key)
    token = base64.b64decode(raw).decode("utf-8", "replace").strip() if raw else ""
    if not token:
        raise ClusterError(f"the Ray token Secret {namespace}/{ref.name} of {where} has no key {ref.key!r}",
                           hint="KubeRay writes it as auth_token; recreate the Secret or the RayCluster")
    return token


def secret_has_key(api_client, namespace: str, name: str, key: str) -> bool | None:
    """Whether Secret ``namespace/name`` holds a non-empty ``key``: None when there is no such Secret. One ``get``;
    the value is never decoded, kept or logged."""
    from kubernetes import client

    try:
        secret = client.CoreV1Api(api_client).read_namespaced_secret(name, namespace)
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return None
        error = api_error(e, f"read the Ray token Secret {namespace}/{name}")
        if _status(e) == 403:
            error.hint = TOKEN_RBAC_HINT
        raise error from None
    return bool((secret.data or {}).get(key))


def head_auth_ref(pod: Any) -> tuple[str, str | None]:
    """How the head pod's Ray container (the first) runs Ray auth: (``token``, the Secret its ``RAY_AUTH_TOKEN``
    is read from -- None when the token is a literal value), or (``disabled``, None) without token mode. Read
    from the pod spec only: no Secret is read."""
    container = (pod.spec.containers or [None])[0]
    env = {e.name: e for e in (getattr(container, "env", None) or [])}
    mode = env.get("RAY_AUTH_MODE")
    if mode is None or (mode.value or "").strip().lower() != "token":
        return "disabled", None
    var = env.get("RAY_AUTH_TOKEN")
    ref = getattr(getattr(var, "value_from", None), "secret_key_ref", None) if var is not None else None
    return "token", (ref.name if ref is not None and ref.name else None)


def _handshake_failure(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status, the API server's message) of a refused port-forward: the client library wraps the websocket
    handshake's answer (``WebSocketBadStatusException``: ``status_code``, ``resp_body`` -- a Kubernetes Status)
    in other exceptions, so the chain is searched for it. (None, the first line) when the server never answered."""
    cur: BaseException | None = e
    for _ in range(8):
        if cur is None:
            break
        status = getattr(cur, "status_code", None)
        if isinstance(status, int):
            message = getattr(cur, "status_message", None) or ""
            try:
                message = json.loads(getattr(cur, "resp_body", None) or "{}").get("message") or message
            except (ValueError, TypeError, AttributeError):
                pass
            return status, str(message)
        cur = cur.__cause__ or cur.__context__
    lines = str(e).strip().splitlines()
    return None, lines[0] if lines else type(e).__name__


def _open_tunnel(core, namespace: str, pod: str, remote_port: int):
    """One port-forward stream to ``pod:remote_port`` through the API server (a websocket). A refusal is typed by
    the API server's HTTP status (Forbidden when RBAC denies pods/portforward; Unreachable when the server cannot
    reach the pod's node) and names the pod."""
    from kubernetes.stream import portforward

    try:
        pf = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(remote_port))
        return pf, pf.socket(remote_port)
    except Exception as e:  # noqa: BLE001 - typed below, from the handshake's status
        status, message = _handshake_failure(e)
        what = f"cannot port-forward to pod {namespace}/{pod} port {remote_port} through the Kubernetes API"
        hint = "is the pod running on a node the API server can reach? 'miles-ray status' shows the pods"
        if status is None:
            raise Unreachable(f"{what} ({message[:300]})", hint=hint) from None
        raise from_http_status(status, f"{what}: HTTP {status}: {message[:300]}", hint) from None


@contextmanager
def port_forward(api_client, namespace: str, pod: str, remote_port: int = 8265) -> Iterator[str]:
    """Forward 127.0.0.1:<free port> to ``pod:remote_port`` through the API server; yields the URL.

    The first stream is opened before anything is yielded, so a pod the API server cannot forward to fails here
    with an Unreachable error naming the pod (instead of a connection reset on the first request)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    pending = [_open_tunnel(core, namespace, pod, remote_port)]  # the checked stream serves the first client
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.5)
    stop = threading.Event()

    def pump(src, dst) -> None:
        try:
            while not stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                _, remote = pending.pop() if pending else _open_tunnel(core, namespace, pod, remote_port)
            except Unreachable:  # the client sees a closed connection
                conn.close()
                continue
            threading.Thread(target=pump, args=(conn, remote), daemon=True).start()
            threading.Thread(target=pump, args=(remote, conn), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()
        thread.join(timeout=2)
        for _, unused in pending:
            unused.close()


# -- other CRDs (queues) --------------------------------------------------------------------------

def installed_crd_versions(api_client, crd_name: str) -> list[str] | None:
    """Served versions of CRD ``crd_name`` (e.g. ``localqueues.kueue.x-k8s.io``), or None when it is not
    installed."""
    crd = read_crd(api_client, crd_name)
    return None if crd is None else crd_served_versions(crd)


def custom_object_exists(api_client, group: str, version: str, plural: str, name: str,
                         namespace: str | None = None) -> bool:
    """Whether the custom object exists (namespaced when ``namespace`` is given, else cluster-scoped)."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    try:
        if namespace is None:
            api.get_cluster_custom_object(group, version, plural, name)
        else:
            api.get_namespaced_custom_object(group, version, namespace, plural, name)
        return True
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return False
        where = f"{namespace}/{name}" if namespace else name
        raise api_error(e, f"read {plural}.{group} {where}") from None


def kueue_workload(api_client, namespace: str, owner_uid: str) -> dict | None:
    """The Kueue Workload that stands for the object ``owner_uid`` (Kueue names it after the object and sets an
    owner reference to it), or None when there is none (or the Workload CRD is not served)."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    for version in ("v1beta2", "v1beta1"):
        try:
            items = api.list_namespaced_custom_object("kueue.x-k8s.io", version, namespace, "workloads")["items"]
        except Exception as e:  # noqa: BLE001
            if _status(e) == 404:
                continue
            raise api_error(e, f"list Kueue workloads in {namespace}") from None
        return next((w for w in items if any(r.get("uid") == owner_uid
                                             for r in w["metadata"].get("ownerReferences") or [])), None)
    return None
