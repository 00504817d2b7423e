"""How a Ray head is named: the address grammar every verb that talks to Ray accepts. Pure.

* ``http(s)://HOST:PORT`` -- the head's dashboard / Jobs API URL, used as is; except the in-cluster
  service URL of a KubeRay head (``http://NAME-head-svc.NAMESPACE.svc[.cluster.local]:8265``), which only
  resolves inside the cluster: from outside it is reached like ``k8s://NAMESPACE/NAME``;
* ``k8s://NAMESPACE/RAYCLUSTER`` -- a KubeRay head reached through a port-forward to its head pod, via the
  Kubernetes API (what ``up`` records when miles-ray runs outside the cluster);
* ``local://NAME`` -- the local cluster of that name on this machine (``up --backend local``).

:func:`parse_head` turns an address into a :class:`HeadAddress`; ``miles_ray.adapters.ray_head.open_head``
turns that into a reachable URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

from miles_ray.core.errors import ConfigError

K8S_SCHEME = "k8s://"
LOCAL_SCHEME = "local://"
DASHBOARD_PORT = 8265
HEAD_SERVICE_SUFFIX = "-head-svc"
LOOPBACK_HOSTS = frozenset({"localhost", "::1"})
ADDRESS_HINT = ("give the Ray dashboard / Jobs API URL (http://HEAD:8265, not the GCS port 6379), "
                "k8s://NAMESPACE/RAYCLUSTER or local://NAME")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SERVICE_HOST = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-head-svc\.(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
                           r"\.svc(\.cluster\.local)?$")


@dataclass(frozen=True)
class HeadAddress:
    """A parsed head address. ``kind`` says how it is reached:

    * ``url``: ``url`` is used as is;
    * ``kubernetes``: the RayCluster ``namespace/name`` (a port-forward from outside the cluster; ``url`` is the
      in-cluster service URL when the address was one, else None);
    * ``local``: the local cluster ``name`` on this machine.
    """

    kind: Literal["url", "kubernetes", "local"]
    address: str
    url: str | None = None
    namespace: str | None = None
    name: str | None = None

    @property
    def on_this_machine(self) -> bool:
        """True when the head runs on this machine (a local cluster, or a loopback URL): its job drivers then
        run with this very interpreter and see this machine's filesystem."""
        if self.kind == "local":
            return True
        if self.kind != "url":
            return False
        host = urlparse(self.url or "").hostname or ""
        return host in LOOPBACK_HOSTS or host.startswith("127.")


def parse_head(address: str, source: str = "address") -> HeadAddress:
    """Parse a head address (see the module doc); ``ConfigError`` naming ``source`` when it is not one."""
    text = (address or "").strip()
    if text.startswith(K8S_SCHEME):
        namespace, sep, name = text[len(K8S_SCHEME):].partition("/")
        if not sep or not _DNS_LABEL.fullmatch(namespace) or not _DNS_LABEL.fullmatch(name):
            raise ConfigError(f"{source} {address!r} is not k8s://NAMESPACE/RAYCLUSTER", hint=ADDRESS_HINT)
        return HeadAddress("kubernetes", text, namespace=namespace, name=name)
    if text.startswith(LOCAL_SCHEME):
        name = text[len(LOCAL_SCHEME):]
        if not re.fullmatch(r"^[a-z0-9][a-z0-9_-]{0,39}$", name):
            raise ConfigError(f"{source} {address!r} is not local://NAME (a local cluster name)", hint=ADDRESS_HINT)
        return HeadAddress("local", text, name=name)
    if not re.match(r"^https?://[^/\s]+", text):
        raise ConfigError(f"{source} {address!r} is not a dashboard URL", hint=ADDRESS_HINT)
    url = text.rstrip("/")
    host = urlparse(url).hostname or ""
    service = _SERVICE_HOST.fullmatch(host)
    if service:
        return HeadAddress("kubernetes", url, url=url, namespace=service["ns"], name=service["name"])
    return HeadAddress("url", url, url=url)


def k8s_address(namespace: str, raycluster: str) -> str:
    """The address of a KubeRay head seen from outside the cluster."""
    return f"{K8S_SCHEME}{namespace}/{raycluster}"


def service_url(namespace: str, raycluster: str) -> str:
    """The head's Jobs API inside the cluster (KubeRay's head service)."""
    return f"http://{raycluster}{HEAD_SERVICE_SUFFIX}.{namespace}.svc:{DASHBOARD_PORT}"


def in_cluster_url(address: str) -> str:
    """What processes inside the cluster use to reach the head (the job's and the launcher's RAY_ADDRESS):
    the head service for a KubeRay head, else the address itself."""
    head = parse_head(address)
    if head.kind == "kubernetes":
        return head.url or service_url(head.namespace or "", head.name or "")
    return address
