"""Thin client over the ``polyaxon`` package (``polyaxon.client.RunClient`` / ``ProjectClient``)
with real errors: every failure becomes one :class:`ClusterError` line (exit code 1).

Facts measured against the real API server (haupt 2.18 sandbox):

* Runs go ``created -> compiled -> queued`` within ~0.1 s of creation; the server compiles the
  operation itself (contexts such as ``{{ globals.uuid }}`` are resolved in ``content``; the
  operation as sent comes back verbatim in ``raw_content``). ``V1Run.kind`` reads ``service`` for a
  Ray cluster; ``runtime`` is ``raycluster``.
* An unknown connection name is only detected at compile time: the run goes straight to ``failed``
  with "Some connection refs were provided but were not found in the agent.connections catalog".
  :func:`create_operation` waits for compilation (``wait_compiled``) and turns that into a
  ClusterError naming the connection. The CE API does NOT expose the agent's connection catalog
  (there is no connections/agents listing endpoint; ``GET /api/v1/orgs/default/agents/state`` is the
  agent's POLL endpoint and has a side effect: it moves queued runs to ``scheduled``), so
  :func:`list_agent_connections` can only read ``POLYAXON_AGENT_CONNECTIONS`` (the variable the
  agent/sandbox itself reads) when it is available locally; it returns ``None`` otherwise.
* Creating a run in a missing project answers 404 (projects are not created implicitly).
* Creating with ``pending="approval"`` does not compile before approval, so it is no pre-check.
* Deleting a run marks it ``live_state=-1`` (deletion in progress, waiting for the agent): it leaves
  the listings at once, but ``GET`` of its uuid still answers (``deleting: True`` in :func:`get_run`)
  and its statuses endpoint answers 404.

polyaxon is imported lazily inside the functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any, Callable, Iterator, TypeVar

from miles_ray.core.errors import ClusterError, ConfigError

T = TypeVar("T")

HOST_ENV = "POLYAXON_HOST"
DEFAULT_OWNER = "default"
DEFAULT_RETRIES = 3  # attempts after the first one
DEFAULT_BACKOFF = 0.5  # seconds, doubled each attempt
DEFAULT_TIMEOUT = 10.0  # seconds per HTTP request

FINAL_STATUSES = frozenset({"succeeded", "failed", "upstream_failed", "stopped", "skipped", "done"})
PRE_COMPILE_STATUSES = frozenset({"created", "on_schedule", "resuming", "retrying"})
_CONNECTION_CATALOG_MSG = "not found in the agent.connections catalog"


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
def _quiet() -> Iterator[None]:
    """polyaxon's client decorators log multi-line error reports before re-raising: mute them."""
    log = logging.getLogger("polyaxon.cli")
    previous = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = previous


def _api_exception(e: BaseException) -> BaseException:
    """Some RunClient methods wrap the ApiException in PolyaxonClientException('Api error: ...')."""
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 5:
        if getattr(cur, "status", None) is not None:
            return cur
        cur = cur.__cause__
        seen += 1
    return e


def _status_of(e: BaseException) -> int | None:
    status = getattr(_api_exception(e), "status", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def _is_retryable(e: BaseException) -> bool:
    import urllib3.exceptions

    e = _api_exception(e) if _status_of(e) is not None else (e.__cause__ or e)

    status = _status_of(e)
    if status is not None and status != 0:
        return status >= 500 or status == 429
    return isinstance(e, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError))


def _body_message(e: BaseException) -> str:
    e = _api_exception(e)
    body = getattr(e, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict):
                for key in ("detail", "errors", "message", "error"):
                    if data.get(key):
                        return str(data[key])
            return json.dumps(data)[:300]
        except ValueError:
            return str(body).strip().splitlines()[0][:300]
    reason = getattr(e, "reason", None)
    if reason:
        return str(reason).splitlines()[0]
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _reason(e: BaseException) -> str:
    """Short cause of a transport failure (e.g. 'Connection refused')."""
    import urllib3.exceptions

    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        e = e.reason
    text = str(e)
    for marker in ("Connection refused", "timed out", "Name or service not known", "Connection reset"):
        if marker in text:
            return marker
    status = _status_of(e)
    if status:
        return f"HTTP {status}: {_body_message(e)}"
    return text.splitlines()[0][:200] if text else type(e).__name__


class PolyaxonApi:
    """One configured client; every public call has bounded retries (connection errors, 5xx, 429)
    with exponential backoff, then raises a one-line :class:`ClusterError`."""

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

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            from polyaxon._constants.globals import NO_AUTH
            from polyaxon._schemas.client import ClientConfig
            from polyaxon.client import PolyaxonClient

            # retries=0: urllib3 must not retry on its own; this class does, boundedly.
            config = ClientConfig(host=self.host, retries=0, timeout=self.timeout, token=self.token)
            with _quiet():
                self._client = PolyaxonClient(config=config, token=self.token or NO_AUTH)
        return self._client

    def _run_client(self, owner: str, project: str, run_uuid: str | None = None):
        from polyaxon.client import RunClient

        with _quiet():
            return RunClient(
                owner=owner, project=project, run_uuid=run_uuid, client=self.client,
                manual_exceptions_handling=True,
            )

    def _project_client(self, owner: str, project: str):
        from polyaxon.client import ProjectClient

        with _quiet():
            return ProjectClient(
                owner=owner, project=project, client=self.client, manual_exceptions_handling=True
            )

    def _call(
        self,
        what: str,
        fn: Callable[[], T],
        not_found: str | None = None,
        before_retry: Callable[[], T | None] | None = None,
    ) -> T:
        attempts = self.retries + 1
        last: BaseException | None = None
        for attempt in range(attempts):
            try:
                with _quiet():
                    return fn()
            except ClusterError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes one ClusterError line
                last = e
                status = _status_of(e)
                if status == 404 and not_found:
                    raise ClusterError(not_found) from None
                if status in (401, 403):
                    raise ClusterError(
                        f"Polyaxon API at {self.host} refused to {what}: HTTP {status} "
                        f"{_body_message(e)}",
                        hint="check POLYAXON_AUTH_TOKEN / polyaxon login",
                    ) from None
                if not _is_retryable(e):
                    detail = f"HTTP {status}: {_body_message(e)}" if status else _body_message(e)
                    raise ClusterError(f"Polyaxon API at {self.host} failed to {what}: {detail}") from None
                if attempt + 1 < attempts:
                    time.sleep(self.backoff * (2**attempt))
                    if before_retry is not None:
                        found = before_retry()
                        if found is not None:
                            return found
        raise ClusterError(
            f"Polyaxon API at {self.host} unreachable: could not {what} after {attempts} attempt(s) "
            f"({_reason(last) if last else 'unknown error'})",
            hint=f"is the Polyaxon server running? check {HOST_ENV}",
        )

    # -- projects ---------------------------------------------------------------------------

    def check_project(self, owner: str, project: str, create: bool = False) -> dict:
        """The project as a dict; ``ClusterError`` if it does not exist (unless ``create``)."""
        pc = self._project_client(owner, project)
        not_found = f"Polyaxon project {owner}/{project} not found on {self.host}"
        try:
            self._call(f"read project {owner}/{project}", pc.refresh_data, not_found=not_found)
            data = pc.project_data
        except ClusterError as e:
            if str(e.message) != not_found:
                raise
            if not create:
                raise ClusterError(
                    not_found, hint=f"create it: polyaxon project create --name {project}"
                ) from None
            data = self._call(
                f"create project {owner}/{project}", lambda: pc.create({"name": project})
            )
        return _plain(data)

    # -- runs -------------------------------------------------------------------------------

    def _runs_named(self, owner: str, project: str, name: str) -> list[dict]:
        """All runs called exactly ``name``, newest first (any status)."""
        rc = self._run_client(owner, project)
        res = self._call(
            f"list runs of {owner}/{project}",
            lambda: rc.list(query=f"name:{name}", sort="-created_at", limit=100),
            not_found=f"Polyaxon project {owner}/{project} not found on {self.host}",
        )
        return [_run_dict(r) for r in getattr(res, "results", None) or [] if r.name == name]

    def find_run_by_name(
        self, owner: str, project: str, name: str, include_final: bool = False
    ) -> dict | None:
        """The newest run called exactly ``name`` (not in a final status unless ``include_final``)."""
        for run in self._runs_named(owner, project, name):
            if include_final or run["status"] not in FINAL_STATUSES:
                return run
        return None

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
          name but a DIFFERENT operation is a ``ClusterError`` (stop it or choose another name).
        * A create retried after a transport error/5xx first looks for the run it may already have
          created (a new run with this name and this exact operation), so retries never duplicate.
        * ``known_connections`` (default: :func:`list_agent_connections`, when it knows): unknown
          connection names are reported BEFORE creation.
        * ``wait_compiled``: wait up to this many seconds until the server has compiled the run;
          a compile failure (e.g. a connection the agent does not know) raises ``ClusterError``.
        """
        from miles_ray.adapters.polyaxon_spec import connection_names

        name = name or op.get("name")
        sent = json.loads(json.dumps(op))
        known = known_connections if known_connections is not None else list_agent_connections()
        if known is not None:
            missing = [c for c in connection_names(op) if c not in set(known)]
            if missing:
                raise ClusterError(
                    f"Polyaxon agent does not know connection(s) {', '.join(missing)} "
                    f"(known: {', '.join(sorted(known)) or 'none'})",
                    hint="register them in the agent (POLYAXON_AGENT_CONNECTIONS) or fix the names",
                )
        previous = self._runs_named(owner, project, name) if name else []
        if reuse_existing:
            live = next((r for r in previous if r["status"] not in FINAL_STATUSES), None)
            if live:
                if self.get_run(owner, project, live["uuid"], with_conditions=False)["raw_content"] == sent:
                    return live["uuid"]
                raise ClusterError(
                    f"a live Polyaxon run named {name} ({live['uuid']}, {live['status']}) exists in "
                    f"{owner}/{project} with a different operation",
                    hint="stop it first or choose another name",
                )
        before = {r["uuid"] for r in previous}
        rc = self._run_client(owner, project)

        def _create():
            return rc.create(
                name=name, tags=list(tags) if tags else None, content=op, meta_info=meta or None
            )

        def _already_created():
            if not name:
                return None
            try:
                for run in self._runs_named(owner, project, name):
                    if run["uuid"] in before:
                        continue
                    if self.get_run(owner, project, run["uuid"], with_conditions=False)["raw_content"] == sent:
                        return _Created(run["uuid"])
            except ClusterError:
                return None  # still unreachable: let the outer loop retry or give up
            return None

        result = self._call(
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
                message = _failure_message(run)
                if _CONNECTION_CATALOG_MSG in message:
                    raise ClusterError(
                        f"Polyaxon agent does not know connection(s) {_connection_set(message)}: "
                        f"run {uuid} failed to compile",
                        hint="register them in the agent (POLYAXON_AGENT_CONNECTIONS) or fix the names",
                    )
                raise ClusterError(f"Polyaxon run {uuid} failed: {message}")
            if status not in PRE_COMPILE_STATUSES:
                return run
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"Polyaxon run {uuid} still `{status}` after {timeout:.0f}s (not compiled)",
                    hint="is the Polyaxon scheduler running?",
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def get_run(self, owner: str, project: str, uuid: str, with_conditions: bool = True) -> dict:
        """Run as a plain dict: uuid, name, status, kind, runtime, tags, meta_info, content
        (compiled operation, dict), raw_content (operation as sent, dict), created_at, conditions."""
        rc = self._run_client(owner, project, uuid)
        not_found = f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}"
        self._call(f"read run {uuid}", rc.refresh_data, not_found=not_found)
        run = _run_dict(rc.run_data)
        if with_conditions and run["deleting"]:
            run["conditions"] = []  # the statuses endpoint already answers 404 for these
        elif with_conditions:
            _, conditions = self._call(
                f"read statuses of run {uuid}", rc.get_statuses, not_found=not_found
            )
            run["conditions"] = [
                {
                    "type": str(_enum(c.type)),
                    "status": str(c.status) if c.status is not None else None,
                    "reason": c.reason,
                    "message": c.message,
                }
                for c in conditions or []
            ]
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
                raise ClusterError(
                    f"Polyaxon run {uuid} is `{run['status']}` after {timeout:.0f}s, "
                    f"wanted {', '.join(sorted(wanted))}"
                )
            time.sleep(0.25)

    def stop_run(self, owner: str, project: str, uuid: str) -> None:
        rc = self._run_client(owner, project, uuid)
        self._call(
            f"stop run {uuid}", rc.stop,
            not_found=f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}",
        )

    def delete_run(self, owner: str, project: str, uuid: str, missing_ok: bool = True) -> None:
        rc = self._run_client(owner, project, uuid)
        try:
            self._call(
                f"delete run {uuid}", rc.delete,
                not_found=f"Polyaxon run {uuid} not found in {owner}/{project} on {self.host}",
            )
        except ClusterError as e:
            if not (missing_ok and "not found" in str(e)):
                raise


class _Created:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid


def _enum(value: Any) -> Any:
    return getattr(value, "value", value)


def _plain(obj: Any) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    data = to_dict() if callable(to_dict) else dict(obj)
    return json.loads(json.dumps(data, default=str))


def _json_or_none(text: Any) -> Any:
    if text is None or isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _run_dict(run: Any) -> dict:
    created = getattr(run, "created_at", None)
    return {
        "uuid": run.uuid,
        "name": run.name,
        "owner": getattr(run, "owner", None),
        "project": getattr(run, "project", None),
        "status": str(_enum(run.status)) if run.status is not None else None,
        "kind": str(_enum(run.kind)) if getattr(run, "kind", None) is not None else None,
        "runtime": str(_enum(run.runtime)) if getattr(run, "runtime", None) is not None else None,
        "tags": list(run.tags or []),
        "meta_info": getattr(run, "meta_info", None),
        "pending": getattr(run, "pending", None),
        "content": _json_or_none(getattr(run, "content", None)),
        "raw_content": _json_or_none(getattr(run, "raw_content", None)),
        "namespace": getattr(getattr(run, "settings", None), "namespace", None),
        # live_state: 1 live, 0 archived, -1 deletion in progress (deleted, awaiting the agent)
        "live_state": _enum(getattr(run, "live_state", None)),
        "deleting": _enum(getattr(run, "live_state", None)) == -1,
        "created_at": created.isoformat() if hasattr(created, "isoformat") else created,
    }


def _failure_message(run: dict) -> str:
    for c in reversed(run.get("conditions") or []):
        if c.get("type") == "failed" and c.get("message"):
            return " ".join(c["message"].split())
    return "no reason given"


def _connection_set(message: str) -> str:
    import re

    m = re.search(r"`\{(.*?)\}`", message)
    if not m:
        return "(see Polyaxon status)"
    return ", ".join(sorted(x.strip().strip("'\"") for x in m.group(1).split(",")))


# ------------------------------------------------------------------------------- functions


def list_agent_connections(host: str | None = None, owner: str = DEFAULT_OWNER) -> list[str] | None:
    """Connection names the Polyaxon agent knows, or ``None`` when they cannot be known.

    The CE API (haupt 2.18) exposes no connection catalog, so this reads the agent's own setting,
    ``POLYAXON_AGENT_CONNECTIONS`` (JSON list of connections) plus the artifacts store
    (``POLYAXON_ARTIFACTS_STORE``), when set in this environment. ``host``/``owner`` are accepted for
    a future server-side listing and currently unused. Malformed JSON raises ``ConfigError``.
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


def check_project(host: str | None, owner: str, project: str, create: bool = False, **kw: Any) -> dict:
    return PolyaxonApi(host, **kw).check_project(owner, project, create=create)


def find_run_by_name(host: str | None, owner: str, project: str, name: str, **kw: Any) -> dict | None:
    return PolyaxonApi(host, **kw).find_run_by_name(owner, project, name)


def create_operation(
    host: str | None,
    owner: str,
    project: str,
    op: dict,
    name: str | None = None,
    tags: list[str] | None = None,
    meta: dict | None = None,
    reuse_existing: bool = True,
    known_connections: list[str] | None = None,
    wait_compiled: float | None = 15.0,
    **kw: Any,
) -> str:
    return PolyaxonApi(host, **kw).create_operation(
        owner, project, op, name=name, tags=tags, meta=meta, reuse_existing=reuse_existing,
        known_connections=known_connections, wait_compiled=wait_compiled,
    )


def get_run(host: str | None, owner: str, project: str, uuid: str, **kw: Any) -> dict:
    return PolyaxonApi(host, **kw).get_run(owner, project, uuid)


def stop_run(host: str | None, owner: str, project: str, uuid: str, **kw: Any) -> None:
    PolyaxonApi(host, **kw).stop_run(owner, project, uuid)


def delete_run(host: str | None, owner: str, project: str, uuid: str, **kw: Any) -> None:
    PolyaxonApi(host, **kw).delete_run(owner, project, uuid)
