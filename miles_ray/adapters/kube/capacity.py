"""GPU capacity preflight: per GPU node, allocatable minus what running/pending pods already request, and
whether the cluster's pods may land there (node selector, taints and tolerations, cordoned, Ready)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miles_ray.adapters.kube.client import api_error

GPU = "nvidia.com/gpu"

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
