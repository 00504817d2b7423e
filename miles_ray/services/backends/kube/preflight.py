"""What must hold before anything is created on Kubernetes: the namespace, the KubeRay CRD (and every field the
rendered RayCluster uses), the queue, the shared volume's claim, enough GPU nodes, the Ray token Secret."""

from __future__ import annotations

from miles_ray.adapters import kube
from miles_ray.core.builders import RAY_TOKEN_KEY
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.crd_fields import first_unknown_field, kuberay_version_needed, unknown_fields
from miles_ray.core.errors import ClusterError, Invalid, NotFound
from miles_ray.services.backends.results import Preflight
from miles_ray.services.queues import check_queue


def create_token_secret_hint(namespace: str, secret: str) -> str:
    return (f"create it once: kubectl -n {namespace} create secret generic {secret} "
            f"--from-literal={RAY_TOKEN_KEY}=$(openssl rand -hex 32) (on the Polyaxon path nobody else creates it: "
            "Polyaxon's RayCluster has no authOptions, so KubeRay makes none); or set ray_auth_secret to an "
            "existing Secret with that key")


def check_token_secret(cfg: MilesRayConfig, api_client, secret: str, who: str) -> str:
    """Refuse, before anything is created, a Ray token Secret that ``who`` (the pods of an operation or job that
    read ``RAY_AUTH_TOKEN`` from it by secretKeyRef) could not start with: missing (their containers would stay
    in CreateContainerConfigError) or without the key ``auth_token``. Returns ``namespace/secret``."""
    has = kube.secret_has_key(api_client, cfg.namespace, secret, RAY_TOKEN_KEY)
    where = f"{cfg.namespace}/{secret}"
    if has is None:
        raise NotFound(f"the Ray token Secret {where} does not exist: {who} read RAY_AUTH_TOKEN from it (key "
                       f"{RAY_TOKEN_KEY}), so their containers could not start (CreateContainerConfigError); "
                       "nothing was created", hint=create_token_secret_hint(cfg.namespace, secret))
    if not has:
        raise ClusterError(f"the Ray token Secret {where} has no key {RAY_TOKEN_KEY} (or it is empty): {who} read "
                           f"RAY_AUTH_TOKEN from that key; nothing was created",
                           hint=create_token_secret_hint(cfg.namespace, secret))
    return where


def unchecked_token_secret(cfg: MilesRayConfig, secret: str) -> str:
    """What a notice says when there is no kubeconfig to check the token Secret with."""
    return (f"the Ray token Secret {cfg.namespace}/{secret} (key {RAY_TOKEN_KEY}; pods without it stay in "
            "CreateContainerConfigError)")


def check_fields_known(rendered: dict, schema: dict | None) -> None:
    """Refuse (exit 2) the fields of the rendered RayCluster that the installed CRD's schema does not declare,
    naming the first (and the version it needs) and any others: the API server would silently drop them (e.g.
    ``spec.authOptions`` on KubeRay < v1.5.1 -- the cluster would then come up without token authentication)."""
    if not schema:
        return  # a CRD without a structural schema prunes nothing
    unknown = first_unknown_field(rendered, schema)
    if unknown is None:
        return
    path, value = unknown
    others = [p for p in unknown_fields(rendered, schema) if p != path]
    raise Invalid(f"the KubeRay operator installed on this cluster does not know RayCluster field {path} "
                  f"(its CRD has no such field; the API server would drop it); it needs KubeRay >= "
                  f"{kuberay_version_needed(path, value)}"
                  + (f"; it does not know {', '.join(others[:5])} either" if others else ""),
                  hint="upgrade the KubeRay operator and its CRDs, or change the setting that renders it")


def preflight(cfg: MilesRayConfig, api_client, nodes: int, claim: bool, reconciling: bool = False,
              rendered: dict | None = None) -> Preflight:
    """Everything that must hold before anything is created. Raises a typed error saying what fails.
    ``claim``: the shared volume's claim must exist (KubeRay: miles-ray mounts it itself). ``rendered``: the
    RayCluster that will be created, checked field by field against the installed CRD."""
    report = Preflight()
    if not kube.namespace_exists(api_client, cfg.namespace):
        raise NotFound(f"namespace {cfg.namespace!r} does not exist",
                       hint=f"create it (kubectl create namespace {cfg.namespace}) or pass --namespace")
    crd = kube.raycluster_crd(api_client)
    if crd is None:
        raise NotFound("the KubeRay RayCluster CRD (rayclusters.ray.io) is not installed on this cluster",
                       hint="install the KubeRay operator (its Helm chart installs the CRDs)")
    versions = kube.crd_served_versions(crd)
    if "v1" not in versions:
        raise ClusterError(f"the installed KubeRay serves RayCluster versions {versions}, not v1",
                           hint="upgrade KubeRay to >= 1.0")
    report.crd_versions = versions
    queue = check_queue(cfg, api_client)
    if queue is not None:
        report.queue = queue
    if rendered is not None:
        check_fields_known(rendered, kube.crd_schema(crd))
    if claim and not kube.pvc_exists(api_client, cfg.namespace, cfg.claim):
        raise NotFound(f"PersistentVolumeClaim {cfg.namespace}/{cfg.claim} does not exist",
                       hint="create the shared volume for models, data and checkpoints, or set volume_claim")
    if not reconciling:
        cap = kube.gpu_capacity(api_client, cfg.node_selector,
                                [t.model_dump(exclude_none=True) for t in cfg.tolerations])
        cpu = cfg.worker_cpu_request
        mem = kube.quantity(cfg.memory_per_node)
        fitting = cap.fitting(cfg.gpus_per_node, cpu, mem)
        report.gpu_nodes = len(cap.nodes)
        report.gpu_nodes_fitting = len(fitting)
        if len(fitting) < nodes:
            eligible = [n for n in cap.nodes if n.eligible]
            busy = [n for n in eligible if n not in fitting]
            excluded = [n for n in cap.nodes if not n.eligible]
            detail = [f"{len(cap.nodes)} node(s) have {kube.GPU}",
                      f"{len(eligible)} match the node selector and tolerations",
                      f"{len(fitting)} have {cfg.gpus_per_node} GPUs, {cpu:g} CPUs and "
                      f"{cfg.memory_per_node} free"]
            if busy:
                detail.append("too full: " + ", ".join(
                    f"{n.name} ({n.gpus_free:g} GPUs, {n.cpu_free:g} CPUs, {n.memory_free / 2**30:.1f}Gi free)"
                    for n in busy[:5]))
            if excluded:
                detail.append("excluded: " + ", ".join(f"{n.name} ({n.why_not})" for n in excluded[:5]))
            raise ClusterError(f"not enough GPU nodes: need {nodes} with {cfg.gpus_per_node} free {kube.GPU} each; "
                               + "; ".join(detail),
                               hint="use fewer --nodes, free GPUs, fix node_selector/tolerations, or ask less per "
                                    "pod (memory_per_node, cpu_request_per_node)")
    return report
