"""One GPU's memory as a live Kubernetes cluster says it: the labels NVIDIA's GPU feature discovery puts on the GPU
nodes (``nvidia.com/gpu.memory`` in MiB, else ``nvidia.com/gpu.product`` through the table of known products,
:func:`miles_ray.core.memory.gpu_memory_from_labels`), read from the nodes the RayCluster's workers run on.

What the memory check holds a job against, in order: ``--gpu-memory`` / ``gpu_memory`` (the user's word, e.g. for
a MIG slice the labels do not describe), else the nodes' labels, else nothing (the GPU parts are estimated, not
checked). Each case is said in ONE notice; an unknown product label with nothing configured is one line, exit 2.
"""

from __future__ import annotations

from miles_ray.adapters import kube
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.heads import parse_head
from miles_ray.core.memory import GIB, MEMORY_LABEL, PRODUCT_LABEL, LabelledGpu, gpu_memory_from_labels, parse_size
from miles_ray.core.progress import Progress, say
from miles_ray.core.submission import SubmitRequest

__all__ = ["cluster_gpu_memory", "labelled_gpu_memory", "memory_on_cluster"]

NO_LABELS = f"the cluster's GPU nodes carry no {MEMORY_LABEL} or {PRODUCT_LABEL} label"


def labelled_gpu_memory(cfg: MilesRayConfig, address: str) -> LabelledGpu | None:
    """What the labels of the GPU nodes of the head at ``address`` say (None: not a Kubernetes head, or no
    kubeconfig to read it with). The nodes cannot be read (no permission to list nodes, the API unreachable): no
    label says, and ``source`` says why."""
    head = parse_head(address)
    if head.namespace is None or kube.missing_kubeconfig(cfg.kubeconfig):  # (only a KubeRay head has one)
        return None
    try:
        nodes = kube.gpu_node_labels(kube.load_client(cfg.kubeconfig, cfg.kube_context), head.namespace, head.name)
    except ClusterError as e:
        return LabelledGpu(gpu_bytes=None, source=f"the GPU nodes' labels cannot be read ({e.message})")
    return gpu_memory_from_labels(nodes)


def cluster_gpu_memory(cfg: MilesRayConfig, address: str) -> tuple[LabelledGpu | None, str | None]:
    """What the GPU nodes' labels of the cluster at ``address`` give the memory check (None: ``gpu_memory`` is
    configured and wins, no label says, or not a Kubernetes head; :func:`~miles_ray.core.memory.check_fit` takes
    it as ``labelled``) and the one notice that says where the GPU memory comes from (None: nothing to say).
    ConfigError: a label this tool cannot read, and nothing configured."""
    if cfg.gpu_memory:
        try:
            labelled = labelled_gpu_memory(cfg, address)
        except ConfigError:  # an unknown product: the configured size is what is held against
            labelled = LabelledGpu(gpu_bytes=None, source="the nodes' GPU product label is not a known one")
        if labelled is None:
            return None, None
        configured = parse_size(cfg.gpu_memory, what="gpu_memory")
        if labelled.gpu_bytes is None:
            return None, f"{labelled.source or NO_LABELS}: the memory check uses gpu_memory {cfg.gpu_memory}"
        if abs(labelled.gpu_bytes - configured) > 0.01 * configured:
            return None, (f"the memory check uses gpu_memory {cfg.gpu_memory} ({configured / GIB:.1f} GiB), not "
                          f"{labelled.source} ({labelled.gpu_bytes / GIB:.1f} GiB)")
        return None, None
    labelled = labelled_gpu_memory(cfg, address)
    if labelled is None:
        return None, None
    if labelled.gpu_bytes is None:
        return None, (f"GPU memory unknown: {labelled.source or NO_LABELS} and neither --gpu-memory nor gpu_memory "
                      "is set: the GPU parts of the memory estimate are not checked")
    unlabelled = f"; {len(labelled.unlabelled)} GPU node(s) without one" if labelled.unlabelled else ""
    return labelled, f"GPU memory {labelled.gpu_bytes / GIB:.1f} GiB per GPU from {labelled.source}{unlabelled}"


def memory_on_cluster(cfg: MilesRayConfig, request: SubmitRequest, address: str,
                      progress: Progress) -> LabelledGpu | None:
    """submit on a Kubernetes head: what the GPU nodes' labels say of one GPU's memory, for the request to be
    validated with (its misfit line then names the label); where the GPU memory comes from is said in one notice.
    None: nothing to add (not a Kubernetes head, ``gpu_memory`` configured, no label says, a rehearsal, or
    --no-memory-check)."""
    if request.rehearse or request.no_memory_check:
        return None
    labelled, notice = cluster_gpu_memory(cfg, address)
    if notice:
        say(progress, f"notice: {notice}")
    return labelled
