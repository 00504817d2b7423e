"""Converting a Polyaxon 2.18 operation offline into the custom resource the Polyaxon agent would create (an
agent config of connections and an artifacts store, volume names made valid, the agent's converter run)."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
from typing import Any, Iterator

from miles_ray.adapters.polyaxon_spec.validation import check_operation, deepest, first_line, guard_worker_templates
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
    operation, compiled = check_operation(op)
    guard_worker_templates(op)
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
        raise SpecError(f"invalid agent connections for the conversion: {first_line(deepest(e))}") from None

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
            raise SpecError(f"Polyaxon cannot convert the operation: {first_line(deepest(e))}") from None

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
