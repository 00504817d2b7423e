"""Kubernetes names: what KubeRay and Polyaxon will accept, checked before anything is created."""

from __future__ import annotations

import re

from miles_ray.core.errors import ConfigError

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# KubeRay refuses RayCluster names longer than this (it derives pod and service names from it).
RAYCLUSTER_NAME_MAX = 53
# Longest suffix miles-ray or KubeRay appends to the cluster name: "-head-svc" (services <= 63).
_LABEL_MAX = 63


def check_cluster_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError("cluster name is empty", hint="use a DNS-1035 label such as 'miles-qwen3'")
    if len(name) > RAYCLUSTER_NAME_MAX:
        raise ConfigError(
            f"cluster name {name!r} is {len(name)} characters; KubeRay allows at most {RAYCLUSTER_NAME_MAX}",
            hint="KubeRay derives pod and service names from it",
        )
    if not DNS1035.fullmatch(name):
        raise ConfigError(
            f"cluster name {name!r} is not a DNS-1035 label",
            hint="use lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
        )
    return name


def label_safe(value: str) -> str:
    """Turn any string (e.g. a recipe name 'Qwen3.5-4B') into a valid label value."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:_LABEL_MAX]
    cleaned = re.sub(r"^[^A-Za-z0-9]+", "", cleaned)
    cleaned = re.sub(r"[^A-Za-z0-9]+$", "", cleaned)
    return cleaned


def check_namespace(ns: str) -> str:
    if not ns or len(ns) > 63 or not re.fullmatch(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", ns):
        raise ConfigError(f"namespace {ns!r} is not a valid Kubernetes namespace (DNS-1123 label)")
    return ns
