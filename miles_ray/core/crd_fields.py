"""Which fields of a rendered custom resource an installed CRD does not know (pure: no I/O).

Users' KubeRay operators vary. An API server given a field its CRD's structural schema does not declare
drops it (``fieldValidation`` defaults to ``Warn``) -- a RayCluster rendered with ``spec.authOptions`` would
then come up WITHOUT token authentication on an operator older than v1.5.1. So before creating anything,
preflight walks the rendered object against the installed CRD's ``openAPIV3Schema``
(:func:`first_unknown_field`) and refuses the first field the user's operator does not know, naming the
KubeRay version that introduced it (:func:`kuberay_version_needed`).
"""

from __future__ import annotations

from typing import Any, Iterator

# The KubeRay release whose RayCluster CRD miles-ray validates against (miles_ray/schemas, cluster/versions.env).
SCHEMA_KUBERAY_VERSION = "v1.6.2"

# First KubeRay release whose RayCluster CRD has the field (derived by comparing the CRDs of the Go module
# github.com/ray-project/kuberay/ray-operator at v1.5.0, v1.5.1, v1.6.0, v1.6.1 and v1.6.2, file
# config/crd/bases/ray.io_rayclusters.yaml). Fields older than v1.5.0 are not listed: the longest listed
# prefix of a path decides, else SCHEMA_KUBERAY_VERSION is named.
FIELD_SINCE: dict[str, str] = {
    "spec.authOptions": "v1.5.1",
    "spec.authOptions.mode": "v1.5.1",
    "spec.authOptions.secretName": "v1.6.0",
    "spec.authOptions.enableK8sTokenAuth": "v1.6.0",
    "spec.upgradeStrategy": "v1.6.0",
}

# The root's ObjectMeta is validated by the API server itself, not by the CRD's schema.
_ROOT_SKIP = frozenset({"apiVersion", "kind", "metadata", "status"})


def _unknown(obj: Any, schema: dict, path: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(schema, dict):
        return
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if not path and key in _ROOT_SKIP:
                continue
            if key in props:
                yield from _unknown(value, props[key], where)
            elif isinstance(extra, dict):
                yield from _unknown(value, extra, where)  # a map: every key takes the value schema
            elif extra is True or preserve:
                continue
            else:
                yield where, value
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from _unknown(item, schema["items"], f"{path}[{i}]")


def unknown_fields(obj: dict, schema: dict) -> list[str]:
    """Every field path of ``obj`` (e.g. ``spec.workerGroupSpecs[0].foo``) that ``schema`` (a CRD version's
    ``openAPIV3Schema``) does not declare and would prune, in document order."""
    return [path for path, _ in _unknown(obj, schema, "")]


def first_unknown_field(obj: dict, schema: dict) -> tuple[str, Any] | None:
    """The first unknown field's path and what ``obj`` holds there, or None when the schema knows them all."""
    return next(_unknown(obj, schema, ""), None)


def _generic(path: str) -> str:
    """``spec.workerGroupSpecs[3].x`` -> ``spec.workerGroupSpecs.x`` (the form FIELD_SINCE uses)."""
    out, depth = [], 0
    for ch in path:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _subpaths(value: Any, path: str) -> Iterator[str]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _subpaths(v, f"{path}.{k}")
    elif isinstance(value, list):
        for v in value:
            yield from _subpaths(v, path)


def _since(generic: str) -> str | None:
    best = ""
    for known in FIELD_SINCE:
        if (generic == known or generic.startswith(known + ".")) and len(known) > len(best):
            best = known
    return FIELD_SINCE[best] if best else None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def kuberay_version_needed(path: str, value: Any = None) -> str:
    """The KubeRay release that introduced the field at ``path`` and everything set under it (``value``, what
    the rendered object holds there), as 'vX.Y.Z' (see FIELD_SINCE; SCHEMA_KUBERAY_VERSION when unlisted)."""
    found = [v for v in (_since(p) for p in _subpaths(value, _generic(path))) if v]
    return max(found, key=_key) if found else SCHEMA_KUBERAY_VERSION
