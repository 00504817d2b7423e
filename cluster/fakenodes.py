"""The fake GPU and CPU nodes: their manifests (with the labels NVIDIA's GPU feature discovery sets), created on
the API server, and when a node counts as ready."""

from __future__ import annotations

from typing import Any

from kubeapi import Api
from testbed import FAKE_GPU_MEMORY_MIB, GPU_RESOURCE, KWOK_ANNOTATION, FakeGPUError

def node_manifest(name: str, gpus: int, cpu: str, memory: str, pods: int, ip: str = "") -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    taints: list[dict[str, str]] = []
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "1Ti"}
    if gpus > 0:
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.count"] = str(gpus)
        labels["nvidia.com/gpu.product"] = "Fake-GPU"
        labels["nvidia.com/gpu.memory"] = FAKE_GPU_MEMORY_MIB  # as GPU feature discovery labels an H100 80GB
        taints.append({"key": GPU_RESOURCE, "effect": "NoSchedule"})
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            # kwok's node-initialize stage keeps addresses that are already there.
            "addresses": ([{"type": "InternalIP", "address": ip}] if ip else [])
            + [{"type": "Hostname", "address": name}],
        },
    }


def node_ip(kind: int, i: int) -> str:
    """Distinct, never-routed InternalIPs: 10.<kind>.x.y (kind 1: GPU nodes, 2: CPU nodes)."""
    return f"10.{kind}.{(i // 250) % 250}.{i % 250 + 1}"


def create_node(api: Api, manifest: dict[str, Any]) -> None:
    code, body = api.request("POST", "/api/v1/nodes", manifest)
    if code not in (201, 409):
        raise FakeGPUError(f"creating node {manifest['metadata']['name']}: HTTP {code}: {body}")
    name = manifest["metadata"]["name"]
    code, node = api.request("GET", f"/api/v1/nodes/{name}")
    labels = manifest["metadata"]["labels"]
    if code == 200 and any((node.get("metadata", {}).get("labels") or {}).get(k) != v for k, v in labels.items()):
        # a node made by an earlier version of this script: the labels it lacks (GPU feature discovery's)
        code, body = api.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}},
                                 "application/merge-patch+json")
        if code != 200:
            raise FakeGPUError(f"patching node labels {name}: HTTP {code}: {body}")
        code, node = api.request("GET", f"/api/v1/nodes/{name}")
    want = manifest["status"]["capacity"]
    have = (node or {}).get("status", {}).get("capacity", {}) if code == 200 else {}
    if any(have.get(k) != v for k, v in want.items()):
        patch = {"status": {"capacity": want, "allocatable": manifest["status"]["allocatable"]}}
        code, body = api.request(
            "PATCH", f"/api/v1/nodes/{name}/status", patch, "application/merge-patch+json"
        )
        if code != 200:
            raise FakeGPUError(f"patching node status {name}: HTTP {code}: {body}")


def node_ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def node_schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready/unreachable taints."""
    lifecycle = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    taints = node.get("spec", {}).get("taints") or []
    return node_ready(node) and not any(t.get("key") in lifecycle for t in taints)
