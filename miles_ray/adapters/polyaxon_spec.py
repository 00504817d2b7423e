"""Polyaxon 2.18 operation specs: validation with Polyaxon's own check, offline conversion to the
custom resource the Polyaxon agent would create.

Shape facts, verified against polyaxon==2.18.0 (tests/integration/test_polyaxon_spec.py pins them):

* ``run.workers`` is a DICT keyed by group name (``workers: {gpu: {replicas: 4, ...}}``);
  a list is rejected ("Input should be a valid dictionary"). The key becomes the KubeRay
  ``groupName``; the head gets ``groupName: head``.
* ``plugins`` (``shm: true``) is valid on the COMPONENT and also on the OPERATION (the operation's
  value overrides the component's when compiled). Keep it on the component; either way the converted
  pods get an ``shm`` emptyDir (medium Memory) mounted at ``/dev/shm`` on head and workers.
* The container ``name`` is free and optional: Polyaxon always renames the main container to
  ``polyaxon-main`` and keeps it FIRST in the pod (KubeRay's rule), followed by the
  ``polyaxon-sidecar`` container; the name given in the spec never reaches Kubernetes.
* ``nodeSelector``/``tolerations`` (and affinity, labels, annotations, serviceAccountName, ...) go in
  the replica's ``environment`` section (``head.environment`` / ``workers.<g>.environment``); put
  directly on the replica they are rejected as unknown fields.
* ``kind: rayjob`` is rejected ("Unsupported run.kind"); unknown fields anywhere are rejected.
* Templates: ``{{ globals.uuid }}`` works in ``run.head`` but NOT in ``run.workers.<group>`` (the
  server's compile fails: "'globals' is undefined" -- a 2.18 bug; :func:`validate_operation` rejects
  it up front). Params work everywhere when written ``{{ name }}``; ``{{ params.name }}`` renders the
  whole param object as JSON. Every main container gets ``POLYAXON_RUN_INSTANCE=<owner>.<project>.
  runs.<uuid>`` from Polyaxon, so workers can read the run uuid at runtime.
* The server stores the operation as sent (``raw_content``) and the compiled one (``content``), in
  which quoted numbers such as env ``"1"`` or cpu ``"8"`` come back as JSON numbers; the agent's
  converter turns them back into strings, so the resulting pods are unaffected.
* ``rayStartParams`` values may be numbers: Polyaxon turns them into strings (KubeRay needs strings).
* ``connections`` are per replica; each named connection becomes a volume named after the connection
  (so a connection name must be a valid DNS-1123 label: ``artifacts_store`` is not, see
  :func:`invalid_volume_names`). The converter mounts the agent's artifacts store in the sidecar and
  init containers of every pod, plus an ``artifacts-context`` emptyDir in all containers.
* Head-only quirks of the converter: ``replicas: null`` on the head group, the dashboard/gcs/client/
  serve ports added to the head container, ``NVIDIA_VISIBLE_DEVICES=none`` set on any container without
  a GPU limit, ``runtimeEnv: "null"`` (the JSON text of ``None``) when no runtimeEnv is given,
  ``restartPolicy: Never`` on every group, a ``preStop: ray stop`` hook on worker containers.
  ``POLYAXON_HOST`` in the injected env comes from the local client config (``POLYAXON_HOST``).
* :func:`to_custom_resource` == what the agent builds from the server's compiled run (checked against
  the real haupt sandbox in tests/integration/test_polyaxon_api.py).

polyaxon is imported lazily inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
import threading
from typing import Any, Iterator

from miles_ray.core.errors import SpecError

#: The connection the Miles docs ask for (a writable PVC mounted at /mnt/miles on every pod).
DEFAULT_CONNECTIONS: list[dict] = [
    {
        "name": "miles-data",
        "kind": "volume_claim",
        "schema": {"volumeClaim": "miles-data", "mountPath": "/mnt/miles"},
    }
]

#: Artifacts store of the offline agent config. Polyaxon requires one; its default name
#: (``artifacts_store``) would become an invalid volume name, so this one uses a hyphen.
DEFAULT_ARTIFACTS_STORE: dict = {
    "name": "artifacts-store",
    "kind": "volume_claim",
    "schema": {"volumeClaim": "polyaxon-artifacts", "mountPath": "/artifacts"},
}

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_AGENT_LOCK = threading.RLock()


# --------------------------------------------------------------------------- validation


def validate_operation(op: dict) -> None:
    """Validate an operation (or component) dict with Polyaxon's own ``check_polyaxonfile``
    (``is_cli=False``) and compile it. Raises :class:`SpecError` with one line naming the field.

    One guard goes beyond Polyaxon's check, for a Polyaxon 2.18 bug its check misses: runtime-context
    templates (``{{ globals.* }}``, ``{{ connections.* }}``, ``{{ init.* }}``) inside
    ``run.workers.<group>`` make the server's compilation fail ("'globals' is undefined"; the run goes
    to ``failed``): per-replica contexts are keyed by group name under ``workers`` and the worker
    section is rendered without them. They work in ``run.head``; params (``{{ name }}``) work in both.
    """
    _check(op)
    _guard_worker_templates(op)


def _guard_worker_templates(op: dict) -> None:
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


def _check(op: dict):
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
        raise SpecError(f"Polyaxon cannot compile the operation: {_first_line(_deepest(e))}") from None
    return operation, compiled


def _deepest(e: BaseException) -> BaseException:
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        nxt = e.__cause__ or e.__context__
        if nxt is None:
            break
        e = nxt
    return e


def _first_line(e: BaseException) -> str:
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
    deep = _deepest(exc)
    detail = _format_pydantic(deep, "") if hasattr(deep, "errors") else None
    return head + (detail or _first_line(deep))


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
        return _locate_k8s_error(run, prefix) or f"{prefix.rstrip('.')}: {_first_line(e)}"
    except Exception as e:
        deep = _deepest(e)
        if hasattr(deep, "errors"):
            return _format_pydantic(deep, prefix)
        return f"{prefix.rstrip('.')}: {_first_line(deep)}"
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
                msg = _first_line(_deepest(e))
                m = re.search(r"unexpected keyword argument '([^']+)'", msg)
                if m:
                    return f"unknown field `{m.group(1)}` in {prefix}{rp}{name}"
                return f"{prefix}{rp}{name}: {msg}"
    return None


# --------------------------------------------------------------------------- conversion


@contextlib.contextmanager
def _agent_config(config: Any, host: str) -> Iterator[None]:
    """Set ``polyaxon.settings.AGENT_CONFIG`` and the client host the converter writes into pods
    (``POLYAXON_HOST``) for the duration of the block only (process-global, hence the lock); the previous
    values are always restored, so a client used elsewhere in the process cannot leak into the output."""
    from polyaxon import settings

    with _AGENT_LOCK:
        previous = settings.AGENT_CONFIG
        previous_host = settings.CLIENT_CONFIG.host
        settings.AGENT_CONFIG = config
        settings.CLIENT_CONFIG.host = host
        try:
            yield
        finally:
            settings.AGENT_CONFIG = previous
            settings.CLIENT_CONFIG.host = previous_host


def connection_names(op: dict) -> list[str]:
    """Connection names an operation/component refers to (run-level, replicas, init), sorted."""
    comp = op.get("component") if isinstance(op.get("component"), dict) else op
    run = (comp or {}).get("run") or {}
    names: set[str] = set()

    def _collect(section: Any) -> None:
        if not isinstance(section, dict):
            return
        names.update(c for c in section.get("connections") or [] if isinstance(c, str))
        for i in section.get("init") or []:
            if isinstance(i, dict) and isinstance(i.get("connection"), str):
                names.add(i["connection"])

    _collect(run)
    for key in ("head", "master", "launcher", "chief", "worker", "ps", "evaluator", "scheduler"):
        _collect(run.get(key))
    for w in (run.get("workers") or {}).values() if isinstance(run.get("workers"), dict) else []:
        _collect(w)
    return sorted(names)


def invalid_volume_names(resource: dict) -> list[str]:
    """Volume names in a converted resource (every pod template) that Kubernetes would reject
    (not a DNS-1123 label, e.g. ``artifacts_store``), sorted and unique."""
    bad = set()
    for spec in _pod_specs(resource):
        for v in spec.get("volumes") or []:
            if not _DNS1123_LABEL.fullmatch(v.get("name", "")) or len(v.get("name", "")) > 63:
                bad.add(v.get("name", ""))
    return sorted(bad)


def _pod_specs(resource: dict) -> Iterator[dict]:
    rcs = resource.get("rayClusterSpec") or {}
    groups = ([rcs["head"]] if rcs.get("head") else []) + list(rcs.get("workers") or [])
    for g in groups:
        spec = ((g or {}).get("template") or {}).get("spec")
        if isinstance(spec, dict):
            yield spec


def _fix_volume_names(resource: dict) -> dict[str, str]:
    """Rename invalid volume names consistently (volumes and every container's volumeMounts)."""
    renames: dict[str, str] = {}
    for name in invalid_volume_names(resource):
        fixed = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-") or "volume"
        renames[name] = fixed
    if not renames:
        return renames
    for spec in _pod_specs(resource):
        for v in spec.get("volumes") or []:
            v["name"] = renames.get(v.get("name"), v.get("name"))
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or []:
                for m in c.get("volumeMounts") or []:
                    m["name"] = renames.get(m.get("name"), m.get("name"))
    return renames


def to_custom_resource(
    op: dict,
    namespace: str,
    run_uuid: str,
    run_name: str,
    project: str,
    owner: str = "default",
    connections: list[dict] | None = None,
    artifacts_store: dict | None = None,
    fix_volume_names: bool = True,
    polyaxon_host: str = "http://localhost:8000",
) -> dict:
    """The ``polyaxon.com/v1`` ``Cluster`` custom resource the Polyaxon agent would create for ``op``.

    Follows the agent's path offline: validate, compile the operation, resolve it (params, contexts
    such as ``{{ globals.uuid }}``, connections) with Polyaxon's resolver under a scoped
    ``AgentConfig`` made of ``namespace``, ``connections`` (default: :data:`DEFAULT_CONNECTIONS`)
    and ``artifacts_store`` (default: :data:`DEFAULT_ARTIFACTS_STORE`), then convert with
    ``Executor.get_resource`` (-> ``RayClusterConverter``) and serialise with the kubernetes client.

    Volume names Kubernetes would reject (underscores, e.g. a connection named ``artifacts_store``)
    are renamed consistently (``_`` -> ``-``) when ``fix_volume_names`` is true; otherwise a
    :class:`SpecError` names them. Unknown connections raise :class:`SpecError` listing the known ones.
    """
    operation, compiled = _check(op)
    _guard_worker_templates(op)
    if not namespace:
        raise SpecError("a namespace is required to convert a Polyaxon operation")
    if not run_uuid:
        raise SpecError("a run uuid is required to convert a Polyaxon operation")

    from kubernetes.client import ApiClient
    from polyaxon._compiler import resolver
    from polyaxon._k8s.executor.executor import Executor
    from polyaxon._schemas.agent import AgentConfig

    conns = copy.deepcopy(DEFAULT_CONNECTIONS if connections is None else connections)
    store = copy.deepcopy(DEFAULT_ARTIFACTS_STORE if artifacts_store is None else artifacts_store)
    try:
        agent = AgentConfig.from_dict(
            {"namespace": namespace, "artifactsStore": store, "connections": conns}
        )
    except Exception as e:
        raise SpecError(f"invalid agent connections for the conversion: {_first_line(_deepest(e))}") from None

    known = sorted({c.get("name") for c in conns} | {store.get("name")})
    missing = [c for c in connection_names(op) if c not in known]
    if missing:
        raise SpecError(
            f"unknown Polyaxon connection(s) {', '.join(missing)}: the agent knows {', '.join(known)}",
            hint="register the connection in the agent (POLYAXON_AGENT_CONNECTIONS) or fix its name",
        )

    with _agent_config(agent, polyaxon_host):
        try:
            res, compiled = resolver.resolve(
                compiled_operation=compiled,
                owner_name=owner,
                project_name=project,
                project_uuid=project,
                run_name=run_name,
                run_uuid=run_uuid,
                run_path=run_uuid,
                params=operation.params,
            )
            resource = Executor.get_resource(
                namespace=compiled.namespace or res.namespace,
                owner_name=res.owner_name,
                project_name=res.project_name,
                run_name=res.run_name,
                run_uuid=res.run_uuid,
                run_path=res.run_path,
                compiled_operation=compiled,
                artifacts_store=res.artifacts_store,
                connection_by_names=res.connection_by_names,
                secrets=res.secrets,
                config_maps=res.config_maps,
                polyaxon_sidecar=res.polyaxon_sidecar,
                polyaxon_init=res.polyaxon_init,
            )
        except SpecError:
            raise
        except Exception as e:
            raise SpecError(f"Polyaxon cannot convert the operation: {_first_line(_deepest(e))}") from None

    if resource is None:
        raise SpecError("Polyaxon produced no resource for this operation")
    out = json.loads(json.dumps(ApiClient().sanitize_for_serialization(resource)))
    if fix_volume_names:
        _fix_volume_names(out)
    else:
        bad = invalid_volume_names(out)
        if bad:
            raise SpecError(
                f"converted resource has volume names Kubernetes rejects: {', '.join(bad)}",
                hint="connection names become volume names: use lowercase letters, digits and '-'",
            )
    return out
