"""The polyaxon client's model objects (``V1Run``, ``V1Project``, ``V1ProjectVersion`` ...) as plain dicts."""

from __future__ import annotations

import json
import re
from typing import Any


def enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


def plain(obj: Any) -> dict:
    """Any client model (or dict) as a JSON-safe dict."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    data = to_dict() if callable(to_dict) else dict(obj)
    return json.loads(json.dumps(data, default=str))


def json_or_none(text: Any) -> Any:
    if text is None or isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def run_dict(run: Any) -> dict:
    """A ``V1Run`` as the dict every caller reads (see ``PolyaxonApi.get_run``)."""
    created = getattr(run, "created_at", None)
    return {
        "uuid": run.uuid,
        "name": run.name,
        "owner": getattr(run, "owner", None),
        "project": getattr(run, "project", None),
        "status": str(enum_value(run.status)) if run.status is not None else None,
        "kind": str(enum_value(run.kind)) if getattr(run, "kind", None) is not None else None,
        "runtime": str(enum_value(run.runtime)) if getattr(run, "runtime", None) is not None else None,
        "tags": list(run.tags or []),
        "meta_info": getattr(run, "meta_info", None),
        "pending": getattr(run, "pending", None),
        "content": json_or_none(getattr(run, "content", None)),
        "raw_content": json_or_none(getattr(run, "raw_content", None)),
        "namespace": getattr(getattr(run, "settings", None), "namespace", None),
        # live_state: 1 live, 0 archived, -1 deletion in progress (deleted, awaiting the agent)
        "live_state": enum_value(getattr(run, "live_state", None)),
        "deleting": enum_value(getattr(run, "live_state", None)) == -1,
        "created_at": created.isoformat() if hasattr(created, "isoformat") else created,
    }


def condition_dict(c: Any) -> dict:
    return {"type": str(enum_value(c.type)), "status": str(c.status) if c.status is not None else None,
            "reason": c.reason, "message": c.message}


def failure_message(run: dict) -> str:
    """The message of the run's last ``failed`` condition, on one line."""
    for c in reversed(run.get("conditions") or []):
        if c.get("type") == "failed" and c.get("message"):
            return " ".join(c["message"].split())
    return "no reason given"


_CATALOG = re.compile(r"not found in the agent\.connections catalog")
_NAME_SET = re.compile(r"`\{(.*?)\}`")


def unknown_connections(message: str) -> list[str] | None:
    """The connection names of Polyaxon's compile verdict "Some connection refs were provided but were not found
    in the agent.connections catalog: `{'a', 'b'}`" (the server reports it only in the failed condition's
    message), or None when the run failed for another reason."""
    m = _NAME_SET.search(message)
    if not _CATALOG.search(message) or not m:
        return None
    return sorted(x.strip().strip("'\"") for x in m.group(1).split(",") if x.strip())
