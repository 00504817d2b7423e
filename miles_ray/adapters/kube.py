"""Kubernetes adapter: API client loading, a thin RayCluster layer over ``CustomObjectsApi`` that raises
real errors, capacity preflight, pod diagnosis and port-forwarding to the Ray head.

The upstream KubeRay Python client is not on PyPI and swallows errors; this one turns every
Kubernetes failure into a :class:`ClusterError` with one clear line (what failed, on what, why).
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

from miles_ray.core.errors import ClusterError, ConfigError

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
CRD_NAME = "rayclusters.ray.io"
GPU = "nvidia.com/gpu"
CONFLICT_RETRIES = 6


# -- client and errors --------------------------------------------------------------------------

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
            raise ClusterError(f"in-cluster Kubernetes config failed: {e}") from None
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
    """Turn a kubernetes client/urllib3 exception into one clear line."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        reason = e.reason or ""
        try:
            body = json.loads(e.body or "{}")
            reason = body.get("message") or reason
        except (ValueError, TypeError):
            pass
        if e.status == 403:
            return ClusterError(f"forbidden: {action}: {reason}",
                                hint="your identity lacks this permission; see manifests/rbac.yaml for what miles-ray needs")
        if e.status == 401:
            return ClusterError(f"unauthorized: {action}: the cluster rejected the credentials in the kubeconfig")
        err = ClusterError(f"{action} failed: HTTP {e.status}: {reason}")
        err.status = e.status  # type: ignore[attr-defined]
        return err
    return ClusterError(f"{action} failed: the Kubernetes API is unreachable ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200]})", hint="check the kubeconfig server and your network")


def is_transient(e: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        return e.status in (429, 500, 502, 503, 504) or e.status == 0
    return isinstance(e, (OSError, ConnectionError)) or type(e).__module__.startswith("urllib3")


def _status(e: BaseException) -> int | None:
    return getattr(e, "status", None)


# -- the thin RayCluster layer ------------------------------------------------------------------

class RayClusters:
    """create/get/list/patch/delete of ``ray.io/v1`` RayClusters, raising ClusterError."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)

    def get(self, namespace: str, name: str) -> dict | None:
        try:
            return self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except Exception as e:  # noqa: BLE001 - mapped to ClusterError
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
                raise ClusterError(f"RayCluster {namespace}/{name} does not exist",
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
            except ClusterError as e:
                if getattr(e, "status", None) in (409, 422) and attempt + 1 < CONFLICT_RETRIES:
                    last = e
                    if on_retry:
                        on_retry(f"RayCluster changed while scaling (HTTP {e.status}); retrying on fresh state")
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise
        raise last or ClusterError("scale failed after retries")


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


def raycluster_crd_versions(api_client) -> list[str] | None:
    """Served versions of the RayCluster CRD, or None when it is not installed."""
    from kubernetes import client

    try:
        crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(CRD_NAME)
    except Exception as e:  # noqa: BLE001
        if _status(e) == 404:
            return None
        raise api_error(e, f"read CRD {CRD_NAME}") from None
    return [v.name for v in crd.spec.versions if v.served]


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


# -- pods: what is going on ---------------------------------------------------------------------

FATAL_WAITING = {"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError",
                 "InvalidImageName", "CreateContainerError", "RunContainerError"}


def cluster_pods(api_client, namespace: str, cluster: str) -> list[dict]:
    """Pods of a RayCluster with phase, node and the reason they are not running (if any)."""
    from kubernetes import client

    try:
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"ray.io/cluster={cluster}").items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"list pods of {cluster}") from None
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
                fatal = waiting.reason in FATAL_WAITING
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
        })
    return sorted(out, key=lambda d: (d["role"] != "head", d["name"]))


# -- port-forward to the head -------------------------------------------------------------------

def head_pod(api_client, namespace: str, cluster: str) -> str:
    from kubernetes import client

    try:
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"ray.io/cluster={cluster},ray.io/node-type=head").items
    except Exception as e:  # noqa: BLE001
        raise api_error(e, f"find the head pod of {cluster}") from None
    running = [p for p in pods if p.status.phase == "Running"]
    if not running:
        raise ClusterError(f"the head pod of {cluster} is not running",
                           hint="'miles-ray status' shows why; 'miles-ray up' waits for it")
    return running[0].metadata.name


@contextmanager
def port_forward(api_client, namespace: str, pod: str, remote_port: int = 8265) -> Iterator[str]:
    """Forward 127.0.0.1:<free port> to ``pod:remote_port`` through the API server; yields the URL."""
    from kubernetes import client
    from kubernetes.stream import portforward

    core = client.CoreV1Api(api_client)
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
                pf = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(remote_port))
                remote = pf.socket(remote_port)
            except Exception:  # noqa: BLE001 - the client sees a closed connection
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
