"""Where a Polyaxon run lives: one :class:`PolyaxonRef`, resolved by one function (:func:`polyaxon_ref`) for a
cluster made through Polyaxon, a launcher job, a tracked run and the model registry. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# what the Polyaxon run is to miles-ray: the run behind a cluster made by 'up' (its RayCluster), the job running an
# upstream launcher (submit --mode launcher on Kubernetes), the non-managed run a Ray job on a Polyaxon-made cluster
# is kept current in, the project the model registry registers in (no run of its own: ``uuid`` None)
Role = Literal["cluster", "launcher-job", "tracked", "registry"]


@dataclass(frozen=True)
class PolyaxonRef:
    """A Polyaxon run: the API ``host`` it is on (None: ``$POLYAXON_HOST``, read by the Polyaxon adapter), its
    ``owner`` and ``project``, its ``uuid`` (None: not created, or a project only) and its ``role``."""

    host: str | None
    owner: str
    project: str | None
    uuid: str | None
    role: Role

    def where(self) -> str:
        run = f" run {self.uuid}" if self.uuid else ""
        return f"Polyaxon project {self.owner}/{self.project}{run}" + (f" at {self.host}" if self.host else "")


def polyaxon_ref(role: Role, entry: Mapping[str, Any] | None, *, host: str | None = None, owner: str | None = None,
                 project: str | None = None) -> PolyaxonRef:
    """The one rule for where a Polyaxon run lives: what its entry keeps (a run record, a cluster's bookkeeping; None
    or empty: nothing kept), else what the configuration says (``host``, ``owner``, ``project``), else for the host
    ``$POLYAXON_HOST`` (``host`` None) and for the owner ``default``. An entry keeps the uuid as
    ``polyaxon_run_uuid`` (a run record) or ``polyaxon_uuid`` (a cluster's bookkeeping)."""
    entry = entry or {}
    uuid = entry.get("polyaxon_run_uuid") or entry.get("polyaxon_uuid")
    return PolyaxonRef(host=entry.get("polyaxon_host") or host or None,
                       owner=entry.get("polyaxon_owner") or owner or "default",
                       project=entry.get("polyaxon_project") or project, uuid=uuid or None, role=role)
