"""Projects and runs through the ``polyaxon`` package's clients, with bounded retries and typed errors
(:mod:`.errors`). See the package doc for what the real API server does."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any, Callable, Iterator, TypeVar

from miles_ray.adapters.polyaxon_api.connections import list_agent_connections
from miles_ray.adapters.polyaxon_api.convert import (condition_dict, failure_message, plain, run_dict,
                                                     unknown_connections)
from miles_ray.adapters.polyaxon_api.errors import HOST_ENV, call_error, is_retryable, unreachable
from miles_ray.adapters.polyaxon_spec import connection_names
from miles_ray.core.errors import ClusterError, Conflict, ConfigError, NotFound, TimedOut

T = TypeVar("T")

DEFAULT_RETRIES = 3  # attempts after the first one
DEFAULT_BACKOFF = 0.5  # seconds, doubled each attempt
DEFAULT_TIMEOUT = 10.0  # seconds per HTTP request

FINAL_STATUSES = frozenset({"succeeded", "failed", "upstream_failed", "stopped", "skipped", "done"})
PRE_COMPILE_STATUSES = frozenset({"created", "on_schedule", "resuming", "retrying"})
CONNECTION_HINT = "register them in the agent (POLYAXON_AGENT_CONNECTIONS) or fix the names"


def resolve_host(host: str | None = None) -> str:
    """The API host from the argument or ``POLYAXON_HOST``; ``ConfigError`` when neither is set."""
    value = (host or os.environ.get(HOST_ENV) or "").strip().rstrip("/")
    if not value:
        raise ConfigError(
            "no Polyaxon API host", hint=f"pass --polyaxon-host or set {HOST_ENV}=http://HOST:PORT"
        )
    if "://" not in value:
        value = "http://" + value
    return value


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """polyaxon's client decorators log multi-line error reports before re-raising: mute them."""
    log = logging.getLogger("polyaxon.cli")
    previous = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = previous


class PolyaxonApi:
    """One configured client; every public call has bounded retries (connection errors, 5xx, 429)
    with exponential backoff, then raises one typed error line (Unreachable after the retries)."""

    def __init__(
        self,
        host: str | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff: float = DEFAULT_BACKOFF,
        timeout: float = DEFAULT_TIMEOUT,
        token: str | None = None,
    ) -> None:
        self.host = resolve_host(host)
        self.retries = max(0, int(retries))
        self.backoff = max(0.0, float(backoff))
        self.timeout = timeout
        self.token = token if token is not None else os.environ.get("POLYAXON_AUTH_TOKEN")
        self._client = None

    # -- plumbing (public for the other modules of this adapter: the registry) --------------------

    @property
    def client(self):
        if self._client is None:
            from polyaxon._constants.globals import NO_AUTH
            from polyaxon._schemas.client import ClientConfig
            from polyaxon.client import PolyaxonClient

            # retries=0: urllib3 must not retry on its own; this class does, boundedly.
            config = ClientConfig(host=self.host, retries=0, timeout=self.timeout, token=self.token)
            with quiet():
                self._client = PolyaxonClient(config=config, token=self.token or NO_AUTH)
        return self._client

    def run_client(self, owner: str, project: str, run_uuid: str | None = None):
        """polyaxon's ``RunClient`` on this connection (errors left to :meth:`call`)."""
        from polyaxon.client import RunClient

        with quiet():
            return RunClient(
                owner=owner, project=project, run_uuid=run_uuid, client=self.client,
                manual_exceptions_handling=True,
            )

    def project_client(self, owner: str, project: str):
        """polyaxon's ``ProjectClient`` on this connection (errors left to :meth:`call`)."""
        from polyaxon.client import ProjectClient

        with quiet():
            return ProjectClient(
                owner=owner, project=project, client=self.client, manual_exceptions_handling=True
            )

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        not_found: str | None = None,
        before_retry: Callable[[], T | None] | None = None,
    ) -> T:
        """``fn()`` with bounded retries of what is worth retrying; a failure is one typed error: NotFound
        (``not_found`` as its message, when given), Forbidden, the HTTP status's type, or Unreachable after the
        last attempt. ``before_retry`` may return the result a lost response had already produced."""
        attempts = self.retries + 1
        last: BaseException | None = None
        for attempt in range(attempts):
            try:
                with quiet():
                    return fn()
            except ClusterError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes one typed error
                last = e
                if not is_retryable(e):
                    raise call_error(e, self.host, what, not_found) from None
                if attempt + 1 < attempts:
                    time.sleep(self.backoff * (2**attempt))
                    if before_retry is not None:
                        found = before_retry()
                        if found is not None:
                            return found
        raise unreachable(self.host, what, attempts, last)

    # -- projects ---------------------------------------------------------------------------

    def check_project(self, owner: str, project: str, create: bool = False) -> dict:
        """The project as a dict; ``NotFound`` if it does not exist (unless ``create``)."""
        pc = self.project_client(owner, project)
        not_found = f"Polyaxon project {owner}/{project} not found on {self.host}"
        try:
            self.call(f"read project {owner}/{project}", pc.refresh_data, not_found=not_found)
            data = pc.project_data
        except NotFound:
            if not create:
                raise NotFound(not_found, hint=f"create it: polyaxon project create --name {project}") from None
            data = self.call(f"create project {owner}/{project}", lambda: pc.create({"name": project}))
        out = plain(data)
        # live_state 1: live; 0: archived; -1: being deleted. The server answers a run created in an archived
        # project with 404 'not found' although the project reads fine: say what it is instead.
        if out.get("live_state") not in (None, 1):
            what = "archived" if out.get("live_state") == 0 else "being deleted"
            raise Conflict(f"Polyaxon project {owner}/{project} on {self.host} is {what}: no run can be created in it",
                           hint=(f"restore it (polyaxon project restore -p {owner}/{project}) or set another "
                                 "polyaxon_project" if what == "archived" else "set another polyaxon_project"))
        return out

    # -- runs -------------------------------------------------------------------------------

    def runs_named(self, owner: str, project: str, name: str) -> list[dict]:
        """All runs called exactly ``name``, newest first (any status)."""
        rc = self.run_client(owner, project)
        res = self.call(
            f"list runs of {owner}/{project}",
            lambda: rc.list(query=f"name:{name}", sort="-created_at", limit=100),
            not_found=f"Polyaxon project {owner}/{project} not found on {self.host}",
        )
        return [run_dict(r) for r in getattr(res, "results", None) or [] if r.name == name]

    def create_operation(
        self,
        owner: str,
        project: str,
        op: dict,
        name: str | None = None,
        tags: list[str] | None = None,
        meta: dict | None = None,
        reuse_existing: bool = True,
        known_connections: list[str] | None = None,
        wait_compiled: float | None = 15.0,
    ) -> str:
        """Create a run from an operation dict; returns its uuid.

        * ``reuse_existing``: if a live run (not in a final status) with the same name was created
          from the same operation, its uuid is returned instead of a duplicate; a live run with that
          name but a DIFFERENT operation is a ``Conflict`` (stop it or choose another name).
        * A create retried after a transport error/5xx first looks for the run it may already have
          created (a new run with this name and this exact operation), so retries never duplicate.
        * ``known_connections`` (default: :func:`list_agent_connections`, when it knows): unknown
          connection names are reported BEFORE creation (``NotFound``).
        * ``wait_compiled``: wait up to this many seconds until the server has compiled the run;
          a compile failure (e.g. a connection the agent does not know) raises a typed error.
        """
        name = name or op.get("name")
        sent = json.loads(json.dumps(op))
        known = known_connections if known_connections is not None else list_agent_connections()
        if known is not None:
            missing = [c for c in connection_names(op) if c not in set(known)]
            if missing:
                raise NotFound(
                    f"Polyaxon agent does not know connection(s) {', '.join(missing)} "
                    f"(known: {', '.join(sorted(known)) or 'none'})", hint=CONNECTION_HINT)
        previous = self.runs_named(owner, project, name) if name else []
        if reuse_existing:
            live = next((r for r in previous if r["status"] not in FINAL_STATUSES), None)
            if live:
                if self.get_run(owner, project, live["uuid"], with_conditions=False)["raw_content"] == sent:
                    return live["uuid"]
                raise Conflict(
                    f"a live Polyaxon run named {name} ({live['uuid']}, {live['status']}) exists in "
                    f"{owner}/{project} with a different operation",
                    hint="stop it first or choose another name",
                )
        before = {r["uuid"] for r in previous}
        rc = self.run_client(owner, project)

        def _create():
            return rc.create(
                name=name, tags=list(tags) if tags else None, content=op, meta_info=meta or None
            )

        def _already_created():
            if not name:
                return None
            try:
                for run in self.runs_named(owner, project, name):
                    if run["uuid"] in before:
                        continue
                    if self.get_run(owner, project, run["uuid"], with_conditions=False)["raw_content"] == sent:
                        return _Created(run["uuid"])
            except ClusterError:
                return None  # still unreachable: let the outer loop retry or give up
            return None

        result = self.call(
            f"create a run in {owner}/{project}",
            _create,
            not_found=f"Polyaxon project {owner}/{project} not found on {self.host}",
            before_retry=_already_created,
        )
        uuid = result.uuid
        if wait_compiled:
            self._wait_compiled(owner, project, uuid, wait_compiled)
        return uuid

    def _wait_compiled(self, owner: str, project: str, uuid: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            run = self.get_run(owner, project, uuid, with_conditions=True)
            status = run["status"]
            if status == "failed":
                # The server refused the operation when compiling it: take the failed run away again, so that
                # nothing is left of a request that never started (and a retry is not a 'live run' conflict).
                message = failure_message(run)
                self.delete_run(owner, project, uuid)
                unknown = unknown_connections(message)
                if unknown:
                    raise NotFound(
                        f"Polyaxon agent does not know connection(s) {', '.join(unknown)}: "
                        f"run {uuid} failed to compile (deleted again)", hint=CONNECTION_HINT)
                raise ClusterError(f"Polyaxon refused the operation: {message} (run {uuid} failed to compile; "
                                   "deleted again, nothing is left)")
            if status not in PRE_COMPILE_STATUSES:
                return run
            if time.monotonic() >= deadline:
                raise TimedOut(
                    f"Polyaxon run {uuid} still `{status}` after {timeout:.0f}s (not compiled)",
                    hint="is the Polyaxon scheduler running?",
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def get_run(self, owner: str, project: str, uuid: str, with_conditions: bool = True) -> dict:
        """Run as a plain dict: uuid, name, status, kind, runtime, tags, meta_info, content
        (compiled operation, dict), raw_content (operation as sent, dict), created_at, conditions."""
        rc = self.run_client(owner, project, uuid)
        not_found = f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}"
        self.call(f"read run {uuid}", rc.refresh_data, not_found=not_found)
        run = run_dict(rc.run_data)
        if with_conditions and run["deleting"]:
            run["conditions"] = []  # the statuses endpoint already answers 404 for these
        elif with_conditions:
            _, conditions = self.call(f"read statuses of run {uuid}", rc.get_statuses, not_found=not_found)
            run["conditions"] = [condition_dict(c) for c in conditions or []]
        return run

    def wait_for_status(
        self, owner: str, project: str, uuid: str, statuses: set[str] | list[str], timeout: float
    ) -> dict:
        wanted = set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(owner, project, uuid, with_conditions=False)
            if run["status"] in wanted:
                return run
            if run["status"] in FINAL_STATUSES:
                raise ClusterError(
                    f"Polyaxon run {uuid} ended `{run['status']}` while waiting for "
                    f"{', '.join(sorted(wanted))}"
                )
            if time.monotonic() >= deadline:
                raise TimedOut(
                    f"Polyaxon run {uuid} is `{run['status']}` after {timeout:.0f}s, "
                    f"wanted {', '.join(sorted(wanted))}"
                )
            time.sleep(0.25)

    def stop_run(self, owner: str, project: str, uuid: str) -> None:
        rc = self.run_client(owner, project, uuid)
        self.call(
            f"stop run {uuid}", rc.stop,
            not_found=f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}",
        )

    def get_logs(self, owner: str, project: str, uuid: str) -> list[dict]:
        """The run's logs as Polyaxon serves them (its streams API: what the run's sidecar archived in the
        artifacts store), oldest first: ``[{"timestamp", "node", "pod", "container", "value"}]``."""
        rc = self.run_client(owner, project, uuid)
        not_found = f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}"
        self.call(f"read run {uuid}", rc.refresh_data, not_found=not_found)
        logs = self.call(f"read logs of run {uuid}", rc.get_logs, not_found=not_found)
        lines = [plain(x) for x in getattr(logs, "logs", None) or []]
        return sorted(lines, key=lambda x: str(x.get("timestamp") or ""))

    def delete_run(self, owner: str, project: str, uuid: str, missing_ok: bool = True) -> None:
        rc = self.run_client(owner, project, uuid)
        try:
            self.call(
                f"delete run {uuid}", rc.delete,
                not_found=f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}",
            )
        except NotFound:
            if not missing_ok:
                raise


class _Created:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
