"""What a failed Polyaxon client call becomes: one typed error (:mod:`miles_ray.core.errors`), chosen from the
HTTP status the server answered with, or from the exception type when it did not answer."""

from __future__ import annotations

import json

from miles_ray.core.errors import ClusterError, Forbidden, NotFound, Unreachable, from_http_status

HOST_ENV = "POLYAXON_HOST"


def api_exception(e: BaseException) -> BaseException:
    """Some RunClient methods wrap the ApiException in PolyaxonClientException('Api error: ...'): the first
    exception in the ``__cause__`` chain that carries an HTTP status."""
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 5:
        if getattr(cur, "status", None) is not None:
            return cur
        cur = cur.__cause__
        seen += 1
    return e


def status_of(e: BaseException) -> int | None:
    status = getattr(api_exception(e), "status", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


RETRYABLE_4XX = {
    429,  # too many requests
    # Method Not Allowed: the request was not handled, so repeating it cannot duplicate anything. Polyaxon's
    # sandbox (haupt, one worker) answers 405 to a POST that arrives while it serves another POST (its own
    # cron thread POSTs every ~2 s): seen on up to half of the creates on a loaded machine.
    405,
}


def is_retryable(e: BaseException) -> bool:
    """Connection errors, timeouts, 5xx, 429 and 405 (see RETRYABLE_4XX) are worth another attempt."""
    import urllib3.exceptions

    status = status_of(e)
    if status is not None and status != 0:
        return status >= 500 or status in RETRYABLE_4XX
    cause = e.__cause__ or e
    return isinstance(cause, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError))


def body_message(e: BaseException) -> str:
    """The server's own explanation (the JSON body's detail/errors/message), else the exception's first line."""
    e = api_exception(e)
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


def transport_reason(e: BaseException) -> str:
    """Short cause of a transport failure for the error line: the HTTP status, else the operating system's own
    words from the innermost OSError (e.g. 'Connection refused'), else the exception's first line."""
    status = status_of(e)
    if status:
        return f"HTTP {status}: {body_message(e)}"
    cur: BaseException | None = e
    for _ in range(8):  # urllib3 chains MaxRetryError.reason -> NewConnectionError -> ConnectionRefusedError
        if cur is None:
            break
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror
        cur = getattr(cur, "reason", None) if isinstance(getattr(cur, "reason", None), BaseException) else (
            cur.__cause__ or cur.__context__)
    text = str(e)
    return text.splitlines()[0][:200] if text else type(e).__name__


def call_error(e: BaseException, host: str, what: str, not_found: str | None = None) -> ClusterError:
    """The typed error for a call that failed without being worth a retry."""
    status = status_of(e)
    if status == 404:
        return NotFound(not_found or f"Polyaxon API at {host}: not found: {what}: {body_message(e)}", status=404)
    if status in (401, 403):
        return Forbidden(f"Polyaxon API at {host} refused to {what}: HTTP {status} {body_message(e)}",
                         hint="check POLYAXON_AUTH_TOKEN / polyaxon login", status=status)
    detail = f"HTTP {status}: {body_message(e)}" if status else body_message(e)
    message = f"Polyaxon API at {host} failed to {what}: {detail}"
    return from_http_status(status, message) if status else ClusterError(message)


def unreachable(host: str, what: str, attempts: int, last: BaseException | None) -> Unreachable:
    return Unreachable(f"Polyaxon API at {host} unreachable: could not {what} after {attempts} attempt(s) "
                       f"({transport_reason(last) if last else 'unknown error'})",
                       hint=f"is the Polyaxon server running? check {HOST_ENV}")
