"""Polyaxon API adapter (over the ``polyaxon`` package's ``RunClient`` / ``ProjectClient``), one module per
responsibility:

* :mod:`.client` -- :class:`PolyaxonApi`: projects and runs (create idempotently, read, wait, stop, delete),
  with bounded retries;
* :mod:`.errors` -- what a failed call becomes: one typed error (:mod:`miles_ray.core.errors`) chosen from the
  HTTP status or the exception type;
* :mod:`.convert` -- the client's model objects as plain dicts;
* :mod:`.connections` -- the connections the agent knows (when they can be known);
* :mod:`.registry` -- the model registry (model versions, MODEL lineage on runs).

Facts measured against the real API server (haupt 2.18 sandbox):

* Runs go ``created -> compiled -> queued`` within ~0.1 s of creation; the server compiles the
  operation itself (contexts such as ``{{ globals.uuid }}`` are resolved in ``content``; the
  operation as sent comes back verbatim in ``raw_content``). ``V1Run.kind`` reads ``service`` for a
  Ray cluster; ``runtime`` is ``raycluster``.
* An unknown connection name is only detected at compile time: the run goes straight to ``failed``
  with "Some connection refs were provided but were not found in the agent.connections catalog".
  :meth:`PolyaxonApi.create_operation` waits for compilation (``wait_compiled``) and turns that into a
  NotFound error naming the connection. The CE API does NOT expose the agent's connection catalog
  (there is no connections/agents listing endpoint; ``GET /api/v1/orgs/default/agents/state`` is the
  agent's POLL endpoint and has a side effect: it moves queued runs to ``scheduled``), so
  :func:`list_agent_connections` can only read ``POLYAXON_AGENT_CONNECTIONS`` (the variable the
  agent/sandbox itself reads) when it is available locally; it returns ``None`` otherwise.
* Creating a run in a missing project answers 404 (projects are not created implicitly).
* Creating with ``pending="approval"`` does not compile before approval, so it is no pre-check.
* Deleting a run marks it ``live_state=-1`` (deletion in progress, waiting for the agent): it leaves
  the listings at once, but ``GET`` of its uuid still answers (``deleting: True`` in ``get_run``)
  and its statuses endpoint answers 404.

polyaxon is imported lazily inside the functions.
"""

from miles_ray.adapters.polyaxon_api.client import FINAL_STATUSES, PolyaxonApi
from miles_ray.adapters.polyaxon_api.connections import list_agent_connections
from miles_ray.adapters.polyaxon_api.registry import ModelRegistry

__all__ = ["FINAL_STATUSES", "ModelRegistry", "PolyaxonApi", "list_agent_connections"]
