"""The Ray token of a RayCluster: how its head pod runs Ray auth (read from the pod spec) and the Secret its
``RAY_AUTH_TOKEN`` comes from (one ``get`` on one Secret; nothing listed). A token is returned, never logged or
put into an error."""

from __future__ import annotations

import base64
from typing import Any

from miles_ray.adapters.kube.client import api_error, http_status
from miles_ray.core.errors import ClusterError

TOKEN_RBAC_HINT = ("the Ray token is read from that Secret: your identity needs 'get' on secrets in the namespace "
                   "(manifests/rbac.yaml)")


def head_ray_token(api_client, namespace: str, cluster: str, pod: Any) -> str | None:
    """The Ray token the head pod runs with, or None when its Ray container (the first) does not run with
    ``RAY_AUTH_MODE=token``. KubeRay's ``authOptions`` (and the Polyaxon path's env) give that container
    ``RAY_AUTH_TOKEN`` from a Secret: that Secret is read here (``get`` on one Secret, nothing listed). The token
    is returned, never logged or put into an error."""
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
        if http_status(e) == 403:
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
        if http_status(e) == 404:
            return None
        error = api_error(e, f"read the Ray token Secret {namespace}/{name}")
        if http_status(e) == 403:
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
