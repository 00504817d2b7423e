"""Where a Polyaxon run lives, for every part of miles-ray that reaches one (a cluster made through Polyaxon, a
launcher job, a tracked run, the model registry): the :class:`~miles_ray.core.records.PolyaxonRef` resolved by the
one rule (:func:`miles_ray.core.records.polyaxon_ref`) and the API client of its host (:func:`client`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from miles_ray.adapters.polyaxon_api import PolyaxonApi
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.records import PolyaxonRef, polyaxon_ref
from miles_ray.core.records.polyaxon_ref import Role


def resolve(role: Role, entry: Mapping[str, Any] | None, cfg: MilesRayConfig | None = None) -> PolyaxonRef:
    """The Polyaxon run of ``entry`` (a run record, a cluster's bookkeeping; None: none kept) as the one rule says,
    ``cfg`` giving what the entry does not keep."""
    if cfg is None:
        return polyaxon_ref(role, entry)
    return polyaxon_ref(role, entry, host=cfg.polyaxon_host, owner=cfg.polyaxon_owner, project=cfg.polyaxon_project)


def client(ref: PolyaxonRef, **options: Any) -> PolyaxonApi:
    """The Polyaxon API client of ``ref``'s host (None: ``$POLYAXON_HOST``); ``options``: the client's (retries)."""
    return PolyaxonApi(host=ref.host, **options)
