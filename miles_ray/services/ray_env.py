"""What Ray's own tools (``ray job list``, ``ray status``, ``ray.init``) need to reach a cluster miles-ray made,
as ``kubectl ray get token`` or ``minikube docker-env`` do: the Jobs API URL (``RAY_API_SERVER_ADDRESS``, read
first by Ray's job CLI and by miles-ray), the GCS address (``RAY_ADDRESS``, what ``ray status`` needs) and the
token (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH`` to a 0600 file; never the token itself)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from miles_ray.adapters import kube, local_ray, ray_auth, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import NotFound
from miles_ray.core.heads import DASHBOARD_PORT, HEAD_SERVICE_SUFFIX
from miles_ray.core.results import Result
from miles_ray.services.heads import kube_raycluster

GCS_PORT = 6379


class RayEnv(Result):
    name: str
    backend: str
    variables: dict[str, str]  # in the order a shell sets them
    port_forward: str | None = None  # Kubernetes without a forward: the command that makes one


def _auth(variables: dict[str, str], token_path: str | None) -> dict[str, str]:
    if token_path:
        variables.update({ray_auth.MODE_ENV: "token", ray_auth.TOKEN_PATH_ENV: token_path})
    return variables


def local_env(cfg: MilesRayConfig) -> RayEnv:
    """The local cluster's dashboard and GCS addresses and its token file (``up`` wrote it 0600)."""
    st = local_ray.read_state(state.local_clusters_dir(), cfg.name)
    if st is None:
        raise NotFound(f"no local cluster named {cfg.name} is running",
                       hint="start one with `miles-ray up --backend local`")
    token = st.get("token_path") if st.get("auth") == "token" else None
    return RayEnv(name=cfg.name, backend="local", variables=_auth(
        {"RAY_API_SERVER_ADDRESS": st["dashboard_url"], "RAY_ADDRESS": st["gcs_address"]}, token))


def _kube_token_file(cfg: MilesRayConfig, api, raycluster: str, pod) -> str | None:
    """The head's Ray token (from its Secret) written 0600 under the state dir; None without token auth."""
    token = kube.head_ray_token(api, cfg.namespace, raycluster, pod)
    if not token:
        return None
    path = state.kube_token_path(cfg.kube_context, cfg.namespace, cfg.name)
    return str(ray_auth.write_token_file(path, token))


def kube_env(cfg: MilesRayConfig, via: str) -> RayEnv:
    """A Kubernetes cluster through a port-forward the user keeps open (``port_forward`` says how), on the
    dashboard and GCS ports of the head service, on this machine's same ports."""
    raycluster = kube_raycluster(cfg)
    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    token = _kube_token_file(cfg, api, raycluster, kube.running_head_pod(api, cfg.namespace, raycluster))
    context = f" --context {cfg.kube_context}" if cfg.kube_context else ""
    forward = (f"kubectl{context} -n {cfg.namespace} port-forward svc/{raycluster}{HEAD_SERVICE_SUFFIX} "
               f"{DASHBOARD_PORT}:{DASHBOARD_PORT} {GCS_PORT}:{GCS_PORT}")
    return RayEnv(name=cfg.name, backend=via, port_forward=forward, variables=_auth(
        {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{DASHBOARD_PORT}", "RAY_ADDRESS": f"127.0.0.1:{GCS_PORT}"},
        token))


@contextmanager
def forwarded_env(cfg: MilesRayConfig, via: str) -> Iterator[RayEnv]:
    """A Kubernetes cluster through port-forwards (dashboard and GCS) that live as long as the block."""
    raycluster = kube_raycluster(cfg)
    api = kube.load_client(cfg.kubeconfig, cfg.kube_context)
    pod = kube.running_head_pod(api, cfg.namespace, raycluster)
    token = _kube_token_file(cfg, api, raycluster, pod)
    with ExitStack() as stack:
        dashboard = stack.enter_context(kube.port_forward(api, cfg.namespace, pod.metadata.name, DASHBOARD_PORT))
        gcs = stack.enter_context(kube.port_forward(api, cfg.namespace, pod.metadata.name, GCS_PORT))
        yield RayEnv(name=cfg.name, backend=via, variables=_auth(
            {"RAY_API_SERVER_ADDRESS": dashboard, "RAY_ADDRESS": gcs.removeprefix("http://")}, token))
