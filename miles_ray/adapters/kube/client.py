"""Kubernetes API clients (kubectl's kubeconfig/context rules, or in-cluster config) and the translation of a
failed call into one typed error (:mod:`miles_ray.core.errors`), chosen from the HTTP status or the exception type,
never from the message text."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from miles_ray.core.errors import ClusterError, ConfigError, Unreachable, from_http_status


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


def http_status(e: BaseException) -> int | None:
    """The HTTP status of a failed call (``ApiException.status``), None when the API did not answer."""
    return getattr(e, "status", None)


def pod_log(core: Any, name: str, namespace: str, **kwargs: Any) -> str:
    """A pod's log as text (``kwargs``: container, previous, ...), read as the raw body: the client's own decoding
    turns a log into the repr of its bytes. API errors are raised as the client raises them."""
    return core.read_namespaced_pod_log(name, namespace, _preload_content=False, **kwargs).data.decode(
        "utf-8", "replace")
