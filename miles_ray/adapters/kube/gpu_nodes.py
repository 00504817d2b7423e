"""The GPU nodes a RayCluster's workers run on (every node that advertises ``nvidia.com/gpu`` while none of them is
placed), and the labels NVIDIA's GPU feature discovery puts on them (``nvidia.com/gpu.*``): a thin read, what the
labels mean is :func:`miles_ray.core.memory.gpu_memory_from_labels`'s."""

from __future__ import annotations

from typing import Any

from miles_ray.adapters.kube.capacity import GPU, quantity
from miles_ray.adapters.kube.client import api_error
from miles_ray.adapters.kube.pods import cluster_selector

LABEL_PREFIX = "nvidia.com/gpu."


def gpu_labels(node: Any) -> dict[str, str]:
    """The ``nvidia.com/gpu.*`` labels of a ``V1Node``."""
    labels = (node.metadata.labels if node.metadata else None) or {}
    return {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}


def placed_gpu_nodes(nodes: list[Any], pods: list[Any]) -> list[Any]:
    """Of ``nodes`` (``V1Node``), those the worker ``pods`` are placed on that advertise GPUs; every node that
    advertises GPUs when none of the pods is placed on one yet."""
    with_gpus = [n for n in nodes if quantity(((n.status.allocatable if n.status else None) or {}).get(GPU, 0)) > 0]
    placed = {p.spec.node_name for p in pods if p.spec and p.spec.node_name}
    return [n for n in with_gpus if n.metadata.name in placed] or with_gpus


def gpu_node_labels(api_client, namespace: str | None = None, cluster: str | None = None) -> dict[str, dict[str, str]]:
    """Node name -> ``nvidia.com/gpu.*`` labels of the GPU nodes the RayCluster ``namespace/cluster``'s workers
    are on (every GPU node when it has none placed, or no cluster is named). API errors are typed
    (:func:`~miles_ray.adapters.kube.client.api_error`)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    try:
        nodes = core.list_node().items
        pods = (core.list_namespaced_pod(namespace, label_selector=cluster_selector(cluster, "worker")).items
                if namespace and cluster else [])
    except Exception as e:  # noqa: BLE001
        raise api_error(e, "list the GPU nodes' labels") from None
    return {n.metadata.name: gpu_labels(n) for n in placed_gpu_nodes(nodes, pods)}
