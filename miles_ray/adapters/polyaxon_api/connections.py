"""The connections the Polyaxon agent knows, when they can be known (see the package doc: the CE API has no
connection catalog)."""

from __future__ import annotations

import contextlib
import json
import os

from miles_ray.core.errors import ConfigError


def list_agent_connections() -> list[str] | None:
    """Connection names the Polyaxon agent knows, or ``None`` when they cannot be known.

    The CE API (haupt 2.18) exposes no connection catalog, so this reads the agent's own setting,
    ``POLYAXON_AGENT_CONNECTIONS`` (JSON list of connections) plus the artifacts store
    (``POLYAXON_ARTIFACTS_STORE``), when set in this environment. Malformed JSON raises ``ConfigError``.
    """
    raw = os.environ.get("POLYAXON_AGENT_CONNECTIONS")
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"POLYAXON_AGENT_CONNECTIONS is not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise ConfigError("POLYAXON_AGENT_CONNECTIONS must be a JSON list of connections")
    names = [c.get("name") for c in data if isinstance(c, dict) and c.get("name")]
    store = os.environ.get("POLYAXON_ARTIFACTS_STORE")
    if store:
        with contextlib.suppress(ValueError, AttributeError):
            names.append(json.loads(store).get("name"))
    return sorted({n for n in names if n})
