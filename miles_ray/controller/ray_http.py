"""THE client of a Ray head's HTTP APIs, standard library only: the Jobs API (``/api/jobs/``: list, info, logs,
submit, stop), the state API's nodes (``/api/v0/nodes``, with ``detail=true`` for their start times), the head's
version and its drivers' activity. The run supervisor (shipped beside ``launchers/supervise.py``), its Polyaxon
reporter and the CLI's adapters (:mod:`miles_ray.adapters.ray_jobs`, :mod:`miles_ray.adapters.local_ray.nodes`) all
speak to Ray through it.

Every failure is one of four exceptions (:class:`HeadError`): :class:`Unreachable` (no answer: refused, reset,
timed out; ``refused`` says a connection was refused), :class:`Refused` (HTTP 401/403: no token, or a wrong one),
:class:`Answered` (another HTTP error status), :class:`NotJson` (an answer that is not JSON: not a Ray dashboard).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

TIMEOUT = 15.0  # seconds, one request
JOBS = "/api/jobs/"
NODES = "/api/v0/nodes?limit=10000"


class HeadError(Exception):
    """A request to the head failed."""


class Unreachable(HeadError):
    """The head did not answer (connection refused, reset, timed out)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Refused(HeadError):
    """The head refused the request's token (HTTP 401: none; 403: a wrong one): waiting changes nothing."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Answered(HeadError):
    """The head answered with another HTTP error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotJson(HeadError):
    """The answer is not JSON (not a Ray dashboard)."""


def _connection_refused(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionRefusedError) or isinstance(getattr(exc, "reason", None),
                                                                 ConnectionRefusedError)


def node_rows(payload: Any) -> list[dict[str, Any]]:
    """The node rows of a state API answer (``{"data": {"result": {"result": [...]}}}``; older Rays: a list)."""
    data = ((payload or {}).get("data") or {}).get("result") or {} if isinstance(payload, Mapping) else {}
    rows = data.get("result", []) if isinstance(data, Mapping) else data
    return list(rows or [])


class RayHead:
    """One Ray head's dashboard (``http://HEAD:8265``). ``token_file``: Ray's token, read at each request (the
    supervisor's mounted Secret); ``headers``: headers for every request (the CLI's, with its token)."""

    def __init__(self, url: str, *, token_file: str | None = None, headers: Mapping[str, str] | None = None,
                 timeout: float = TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.headers = dict(headers or {})
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.headers}
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError:
                token = ""
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, Any]:
        """(HTTP status, JSON answer or text). :class:`Unreachable` without an answer, :class:`Refused` on 401/403."""
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:  # noqa: S310 - the head's URL
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise Unreachable(f"{type(e).__name__}: {getattr(e, 'reason', e)}", _connection_refused(e)) from None
        if status in (401, 403):
            raise Refused(f"{method} {path}: HTTP {status} ({'no token' if status == 401 else 'a wrong token'})",
                          status)
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path: str, timeout: float | None = None) -> Any:
        """The JSON answer of ``GET path`` (200); :class:`Answered` for another status, :class:`NotJson`."""
        status, out = self.call("GET", path, timeout=timeout)
        if status != 200:
            raise Answered(f"GET {path} answered HTTP {status}", status)
        if isinstance(out, str):
            raise NotJson(f"the answer to GET {path} is not JSON: not a Ray dashboard")
        return out

    # -- the Jobs API ------------------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        out = self.get(JOBS)
        if not isinstance(out, list):
            raise NotJson(f"GET {JOBS} answered no list")
        return out

    def job(self, sid: str) -> dict[str, Any] | None:
        """The job's info, None when the head has no job of that id."""
        try:
            out = self.get(JOBS + urllib.parse.quote(sid))
        except Answered as e:
            if e.status == 404:
                return None
            raise
        return out if isinstance(out, dict) else None

    def logs(self, sid: str) -> str:
        """The job's whole logs (the Jobs API has no offset); :class:`Answered` 404 for an unknown job."""
        out = self.get(f"{JOBS}{urllib.parse.quote(sid)}/logs")
        return str(out.get("logs") or "") if isinstance(out, dict) else ""

    def submit(self, sid: str, entrypoint: str, runtime_env: Mapping[str, Any] | None = None,
               metadata: Mapping[str, str] | None = None) -> tuple[bool, str]:
        """(created, what the head said). Not created when a job of that id exists already."""
        payload: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": sid}
        if runtime_env:
            payload["runtime_env"] = dict(runtime_env)
        if metadata:
            payload["metadata"] = dict(metadata)
        status, out = self.call("POST", JOBS, payload)
        return (True, "submitted") if status == 200 else (False, f"HTTP {status}: {str(out)[:300]}")

    def stop(self, sid: str, timeout: float | None = None) -> bool:
        """Ask the head to stop the job: True if a stop was issued (False: it had ended); :class:`Answered` when
        the head refused it (404: no such job)."""
        path = f"{JOBS}{urllib.parse.quote(sid)}/stop"
        status, out = self.call("POST", path, timeout=timeout)
        if status != 200:
            raise Answered(f"POST {path} answered HTTP {status}", status)
        return bool(out.get("stopped")) if isinstance(out, dict) else True

    # -- the state API and the rest ----------------------------------------------------------------------------
    def nodes(self, detail: bool = True, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every node Ray knows (ALIVE and DEAD). ``detail``: with ``start_time_ms`` (without it Ray leaves the
        detail fields out)."""
        return node_rows(self.get(NODES + ("&detail=true" if detail else ""), timeout))

    def version(self, timeout: float | None = None) -> str | None:
        """The Ray version the head runs, None if it does not say."""
        out = self.get("/api/version", timeout)
        version = out.get("ray_version") if isinstance(out, dict) else None
        return str(version) if version else None

    def jobs_api_answers(self, timeout: float | None = None) -> bool:
        """The Jobs API answers 200 (the dashboard's job module is loaded)."""
        try:
            return self.call("GET", JOBS, timeout=timeout)[0] == 200
        except HeadError:
            return False

    def driver_activity(self, timeout: float = 10.0) -> dict[str, Any]:
        """The dashboard's activity of drivers (``is_active``, ``last_activity_at``...), {} when it says none."""
        out = self.get(f"/api/component_activities?timeout={int(timeout)}", timeout + 5)
        return (out or {}).get("driver") or {} if isinstance(out, dict) else {}


# what a caller that waits out a restarting head treats as "no answer yet" (a refused token is not one)
NO_ANSWER = (Unreachable, Answered, NotJson)
