"""The one way to reach a Ray head: :func:`open_head` turns any head address (``miles_ray.core.heads``) into an
http URL of its dashboard / Jobs API for the duration of a ``with`` block.

* an http URL: used as is;
* ``k8s://NAMESPACE/RAYCLUSTER``, or the head service URL ``http://NAME-head-svc.NAMESPACE.svc:8265`` from
  outside the cluster: a port-forward to the head pod's 8265 through the Kubernetes API
  (:func:`miles_ray.adapters.kube.port_forward`), checked before it is used -- a head that cannot be reached
  that way is one ``Unreachable`` error naming the RayCluster and its pod;
* ``local://NAME``: the dashboard of the local cluster ``NAME`` on this machine.

Every verb that talks to Ray goes through here (submit, logs, status, stop, runs, check-data, comm-check,
doctor, register, runs compare), and so every request inside the block carries the head's Ray token
(:mod:`miles_ray.adapters.ray_auth`): a local cluster's own token file (also for its dashboard URL, which run
records keep), the Secret a KubeRay head pod reads ``RAY_AUTH_TOKEN`` from, else ``$RAY_AUTH_TOKEN`` /
``$RAY_AUTH_TOKEN_PATH``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from miles_ray.adapters import kube, local_ray, ray_auth, ray_jobs, state
from miles_ray.core.errors import ClusterError, Unreachable
from miles_ray.core.heads import DASHBOARD_PORT, HeadAddress, parse_head


def in_cluster() -> bool:
    """True inside a Kubernetes pod (the service URLs of the cluster resolve here)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def local_dashboard(name: str) -> str:
    """The dashboard URL of the local cluster ``name`` on this machine (NotFound-like ClusterError when none)."""
    return local_ray.status(state.local_clusters_dir(), name)["dashboard_url"]


def remember_local_tokens(url: str) -> None:
    """When ``url`` is the dashboard of a local cluster on this machine, send its token with requests to it."""
    head = parse_head(url)
    if not head.on_this_machine:
        return
    directory = state.local_clusters_dir()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            local_ray.read_state(directory, path.stem)  # reading a state makes its token known for its URL
        except ClusterError:
            continue


def local_token_path(url: str) -> str | None:
    """The token file of the local cluster whose dashboard is ``url`` (None: not a local token-auth cluster)."""
    head = parse_head(url)
    if head.kind == "local":
        state_ = local_ray.read_state(state.local_clusters_dir(), head.name or "")
        return (state_ or {}).get("token_path") if (state_ or {}).get("auth") == "token" else None
    if not head.on_this_machine:
        return None
    directory = state.local_clusters_dir()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            found = local_ray.read_state(directory, path.stem)
        except ClusterError:
            continue
        if found and found.get("dashboard_url") == url.rstrip("/") and found.get("auth") == "token":
            return found.get("token_path")
    return None


def kube_head_auth(address: str | HeadAddress, *, kube_context: str | None = None,
                   kubeconfig: str | None = None) -> tuple[str, str | None]:
    """How the running head pod of the KubeRay head at ``address`` runs Ray auth: (``token``, the Secret its
    ``RAY_AUTH_TOKEN`` comes from) or (``disabled``, None). Reads the pod spec; no Secret is read."""
    head = address if isinstance(address, HeadAddress) else parse_head(address)
    api = kube.load_client(kubeconfig, kube_context)
    return kube.head_auth_ref(kube.running_head_pod(api, head.namespace or "", head.name or ""))


# the head pod each open port-forward reaches (its URL -> pod name and UID): who is serving, for run records
_SERVING: dict[str, dict[str, str]] = {}


def serving_pod(url: str) -> dict[str, str] | None:
    """The head pod (``pod``: NAMESPACE/NAME, ``pod_uid``) that ``url``, a port-forward :func:`open_head` holds
    open, reaches; None for a head that is not a Kubernetes pod reached that way."""
    return _SERVING.get(url)


def local_head_gone(address: str) -> str | None:
    """Why the head of the local cluster at ``address`` (``local://NAME`` or its dashboard URL) is known to be
    gone: its recorded head process is no longer running. None when it runs, or no local cluster of this machine
    is at ``address`` (then nothing is known)."""
    head = parse_head(address)
    if head.kind == "local":
        found = local_ray.read_state(state.local_clusters_dir(), head.name or "")
    elif head.on_this_machine:
        directory = state.local_clusters_dir()
        found = None
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            try:
                st = local_ray.read_state(directory, path.stem)
            except ClusterError:
                continue
            if st and st.get("dashboard_url") == address.rstrip("/"):
                found = st
    else:
        return None
    proc = (found or {}).get("head")
    if not proc or local_ray.leader_alive(proc):
        return None
    return f"the head process (pid {proc.get('pid')}) of local cluster {found.get('name')} is not running"


@contextmanager
def open_head(address: str | HeadAddress, *, kube_context: str | None = None,
              kubeconfig: str | None = None) -> Iterator[str]:
    """Yield an http URL that reaches the head named by ``address`` (see the module doc). A port-forward lives
    as long as the ``with`` block; kubeconfig/context say which Kubernetes API to forward through."""
    head = address if isinstance(address, HeadAddress) else parse_head(address)
    if head.kind == "url":
        remember_local_tokens(head.url or head.address)
        yield head.url or head.address
        return
    if head.kind == "local":
        yield local_dashboard(head.name or "")
        return
    if head.url and in_cluster():  # the head service resolves from inside the cluster
        yield head.url
        return
    namespace, name = head.namespace or "", head.name or ""
    api = kube.load_client(kubeconfig, kube_context)
    head_pod = kube.running_head_pod(api, namespace, name)
    pod = head_pod.metadata.name
    token = kube.head_ray_token(api, namespace, name, head_pod)
    with kube.port_forward(api, namespace, pod, DASHBOARD_PORT) as url, ray_auth.using(url, token):
        try:
            ray_jobs.ray_version(url)  # the head answers through the forward, or we say which pod did not
        except Unreachable as e:
            raise Unreachable(f"the Ray head of RayCluster {namespace}/{name} (pod {namespace}/{pod}) does not "
                              f"answer through a port-forward to its port {DASHBOARD_PORT} ({e.message})",
                              hint="'miles-ray status' shows the pods; 'miles-ray doctor' says why") from None
        _SERVING[url] = {"pod": f"{namespace}/{pod}", "pod_uid": str(head_pod.metadata.uid or "")}
        try:
            yield url
        except Unreachable as e:
            if url not in e.message:
                raise
            # the forward's local URL means nothing to the user: name the head it reached, and its pod
            raise Unreachable(e.message.replace(url, f"k8s://{namespace}/{name} (pod {namespace}/{pod})"),
                              hint=e.hint) from None
        finally:
            _SERVING.pop(url, None)
