"""Offline validation of RayCluster documents against the KubeRay CRD's OpenAPI schema."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from miles_ray.core.errors import SpecError


def _strict(node: Any) -> Any:
    """Map Kubernetes extensions onto plain OpenAPI 3.0 and forbid unknown fields like the API server's
    strict field validation does (except where the schema preserves unknown fields)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    for key in [k for k in out if k.startswith("x-kubernetes-")]:
        out.pop(key)
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=1)
def _validator():
    from openapi_schema_validator import OAS30Validator

    raw = json.loads(resources.files("miles_ray.schemas").joinpath("raycluster_v1.json").read_text())
    schema = _strict(raw)
    # metadata is validated by the API server, not the CRD schema; accept any object there.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return OAS30Validator(schema)


def validate_raycluster(doc: dict[str, Any]) -> None:
    """Raise SpecError naming the first schema violation (path and reason)."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        path = ".".join(str(p) for p in first.absolute_path) or "(root)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SpecError(f"RayCluster {path}: {first.message}{more}",
                        hint="the KubeRay v1 CRD schema rejects it")
