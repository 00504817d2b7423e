"""Validating a Polyaxon 2.18 operation with Polyaxon's own check and compilation, and the one line that names
the field at fault (a Pydantic location, a Kubernetes field of a replica, a runtime template in a worker group)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from typing import Any

from miles_ray.core.errors import SpecError


def validate_operation(op: dict) -> None:
    """Validate an operation (or component) dict with Polyaxon's own ``check_polyaxonfile``
    (``is_cli=False``) and compile it. Raises :class:`SpecError` with one line naming the field.

    One guard goes beyond Polyaxon's check, for a Polyaxon 2.18 bug its check misses: runtime-context
    templates (``{{ globals.* }}``, ``{{ connections.* }}``, ``{{ init.* }}``) inside
    ``run.workers.<group>`` make the server's compilation fail ("'globals' is undefined"; the run goes
    to ``failed``): per-replica contexts are keyed by group name under ``workers`` and the worker
    section is rendered without them. They work in ``run.head``; params (``{{ name }}``) work in both.
    """
    check_operation(op)
    guard_worker_templates(op)


def guard_worker_templates(op: dict) -> None:
    bad = worker_template_paths(op)
    if bad:
        raise SpecError(
            f"{bad[0]}: Polyaxon 2.18 cannot resolve {{{{ globals/connections/init }}}} in Ray worker "
            "groups (server compile fails: 'globals' is undefined)",
            hint="use a literal or a param ({{ name }}) in workers; POLYAXON_RUN_INSTANCE holds the run uuid",
        )


_RUNTIME_CONTEXT = re.compile(r"\{\{[^}]*\b(globals|connections|init)\b")


def worker_template_paths(op: dict) -> list[str]:
    """Paths under ``run.workers`` whose strings use runtime contexts (see validate_operation)."""
    comp, prefix = op, ""
    if isinstance(op.get("component"), dict):
        comp, prefix = op["component"], "component."
    run = comp.get("run") if isinstance(comp, dict) else None
    workers = run.get("workers") if isinstance(run, dict) else None
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, str):
            if _RUNTIME_CONTEXT.search(value):
                found.append(path)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    if isinstance(workers, dict):
        walk(workers, prefix + "run.workers")
    return found


def check_operation(op: dict):
    if not isinstance(op, dict):
        raise SpecError(f"Polyaxon spec must be a mapping, got {type(op).__name__}")
    try:
        text = json.dumps(op)
    except (TypeError, ValueError) as e:
        raise SpecError(f"Polyaxon spec is not JSON-serialisable: {e}") from None

    from polyaxon._polyaxonfile import OperationSpecification, check_polyaxonfile

    # check_polyaxonfile only reads files/URLs/modules: hand it a temporary JSON file.
    fd, path = tempfile.mkstemp(prefix="miles-ray-op-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            operation = check_polyaxonfile(polyaxonfile=path, is_cli=False, verbose=False)
        except Exception as e:  # PolyaxonfileError wrapping the real cause
            raise SpecError(_explain(op, e)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    try:
        compiled = OperationSpecification.compile_operation(operation)
    except Exception as e:
        raise SpecError(f"Polyaxon cannot compile the operation: {first_line(deepest(e))}") from None
    return operation, compiled


def deepest(e: BaseException) -> BaseException:
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        nxt = e.__cause__ or e.__context__
        if nxt is None:
            break
        e = nxt
    return e


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def _clean_loc(loc: tuple) -> list[str]:
    """Drop pydantic's union-branch markers (class names, ``function-after[...]``, type tags)."""
    tags = {"int", "str", "float", "bool", "dict", "list", "none", "is-instance", "literal"}
    out = []
    for part in loc:
        s = str(part)
        if s.startswith("V1") or "[" in s or s in tags:
            continue
        out.append(s)
    return out


def _format_pydantic(err: Any, prefix: str) -> str | None:
    try:
        errors = err.errors()
    except Exception:
        return None
    useful = [
        x for x in errors
        if not any("function-after" in str(p) for p in x["loc"][-1:])
        and not (x["type"] == "string_type" and "function-after" in "".join(map(str, x["loc"])))
    ] or errors
    # Prefer the most specific location; among equals, keep Polyaxon's order.
    best = max(useful, key=lambda x: len(_clean_loc(x["loc"])))
    loc = _clean_loc(best["loc"])
    path = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "<root>"
    if best["type"] == "extra_forbidden":
        parent = prefix + ".".join(loc[:-1]) if len(loc) > 1 else prefix.rstrip(".") or "<root>"
        return f"unknown field `{loc[-1] if loc else '?'}` in {parent}"
    msg = best["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{path}: {msg}"


def _explain(op: dict, exc: BaseException) -> str:
    """One line naming the offending field. Polyaxon's top-level error for a bad ``run`` is a noisy
    union report, so re-validate the narrowest piece (run, replica, container) to locate it."""
    head = "Polyaxon rejects the spec: "
    comp, prefix = op, ""
    if isinstance(op.get("component"), dict):
        comp, prefix = op["component"], "component."
    run = comp.get("run") if isinstance(comp, dict) else None
    if isinstance(run, dict):
        detail = _explain_run(run, prefix + "run.")
        if detail:
            return head + detail
    deep = deepest(exc)
    detail = _format_pydantic(deep, "") if hasattr(deep, "errors") else None
    return head + (detail or first_line(deep))


def _explain_run(run: dict, prefix: str) -> str | None:
    from polyaxon._flow.run.enums import V1RunKind
    from polyaxon._flow.run.patch import validate_run_patch

    kind = run.get("kind")
    kinds = [k.value for k in V1RunKind]
    if kind not in kinds:
        return (
            f"{prefix}kind: unknown run kind {kind!r} (Polyaxon 2.18 kinds: {', '.join(kinds)}; "
            "Ray is `raycluster`, `rayjob` was removed in 2.12)"
        )
    try:
        # validate_run_patch falls back to the replica schema on error (noisy "unknown field head"):
        # validate against the kind's own class first, then Polyaxon's run-patch validator.
        cls = _run_classes().get(kind)
        if cls is not None:
            cls.from_dict(run)
        validate_run_patch(run, kind)
    except TypeError as e:  # kubernetes model constructors: unexpected keyword argument
        return _locate_k8s_error(run, prefix) or f"{prefix.rstrip('.')}: {first_line(e)}"
    except Exception as e:
        deep = deepest(e)
        if hasattr(deep, "errors"):
            return _format_pydantic(deep, prefix)
        return f"{prefix.rstrip('.')}: {first_line(deep)}"
    return None


def _run_classes() -> dict:
    from polyaxon import schemas as s

    names = {
        "job": "V1Job", "service": "V1Service", "dag": "V1Dag", "mpijob": "V1MPIJob",
        "pytorchjob": "V1PytorchJob", "tfjob": "V1TFJob", "raycluster": "V1RayCluster",
        "daskcluster": "V1DaskCluster", "notifier": "V1NotifierJob", "tuner": "V1TunerJob",
        "cleaner": "V1CleanerJob",
    }
    return {k: getattr(s, v) for k, v in names.items() if hasattr(s, v)}


def _locate_k8s_error(run: dict, prefix: str) -> str | None:
    from polyaxon._k8s import k8s_validation

    replicas: list[tuple[str, Any]] = [("", run)]
    if isinstance(run.get("head"), dict):
        replicas.append(("head.", run["head"]))
    if isinstance(run.get("workers"), dict):
        replicas += [(f"workers.{n}.", w) for n, w in run["workers"].items() if isinstance(w, dict)]
    for rp, replica in replicas:
        checks = [("container", replica.get("container"), k8s_validation.validate_k8s_container)]
        checks += [(f"sidecars[{i}]", c, k8s_validation.validate_k8s_container)
                   for i, c in enumerate(replica.get("sidecars") or [])]
        checks += [(f"volumes[{i}]", v, k8s_validation.validate_k8s_volume)
                   for i, v in enumerate(replica.get("volumes") or [])]
        for name, value, fn in checks:
            if value is None:
                continue
            try:
                fn(value)
            except Exception as e:
                msg = first_line(deepest(e))
                m = re.search(r"unexpected keyword argument '([^']+)'", msg)
                if m:
                    return f"unknown field `{m.group(1)}` in {prefix}{rp}{name}"
                return f"{prefix}{rp}{name}: {msg}"
    return None
