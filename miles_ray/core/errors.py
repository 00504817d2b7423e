"""Errors that the CLI turns into one clear line and an exit code (never a traceback).

Adapters raise the typed subclasses below (never a bare third-party exception, and callers never classify
an error by matching its message text); ``miles_ray.cli.app`` maps them to exit codes in one place:

====  ======================================================================================
code  meaning
====  ======================================================================================
0     done
1     a cluster or service failed us (unreachable, conflict, forbidden, timed out), or a named cluster or run
      was not found (one code for both)
2     bad input (flags, config, recipe file, an infeasible split, a spec the server refuses)
3     the job failed (``status RUN``, ``logs -f``, ``submit --wait`` ending FAILED)
4     checks found problems (``doctor``, ``check-data``, ``comm-check``)
5     the job is still pending or running (``status RUN``)
6     the job was stopped (``status RUN``)
130   interrupted (Ctrl-C / SIGTERM): what was left in place and how to resume is printed
====  ======================================================================================
"""

from __future__ import annotations

import re

from miles_ray.core.secrets import redact

EXIT_OK = 0
EXIT_SERVICE = 1
EXIT_BAD_INPUT = 2
EXIT_JOB_FAILED = 3
EXIT_CHECKS_FAILED = 4
EXIT_JOB_RUNNING = 5
EXIT_JOB_STOPPED = 6
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_SERVICE: "a cluster or service failed (unreachable, conflict, forbidden, timed out), or a cluster or run named was not found",
    EXIT_BAD_INPUT: "bad input (flags, config, recipe file, an infeasible split, a refused spec)",
    EXIT_JOB_FAILED: "the job failed",
    EXIT_CHECKS_FAILED: "checks found problems (doctor, check-data, comm-check)",
    EXIT_JOB_RUNNING: "the job is still pending or running (status RUN)",
    EXIT_JOB_STOPPED: "the job was stopped (status RUN)",
    EXIT_INTERRUPTED: "interrupted; the message says what was left in place and how to resume",
}


class MilesRayError(Exception):
    """Base error. ``exit_code`` says which row of the table above it is."""

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str | None = None) -> None:
        # an error line may echo what the user typed: never a credential (it ends up in CI logs)
        message, hint = redact(message), redact(hint) if hint else hint
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


# -- bad input (exit 2) ----------------------------------------------------------------------------
class ConfigError(MilesRayError):
    """Bad configuration: flags, env vars, config file, recipe file."""


class SpecError(MilesRayError):
    """A generated or given spec is invalid (Polyaxon or KubeRay schema)."""


class PlanError(MilesRayError):
    """The requested split is infeasible; carries the violated rules."""

    def __init__(self, message: str, violations: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.violations = violations or []


class MemoryMisfit(PlanError):
    """The job's memory estimate does not fit the GPUs, the pods or the claim (miles_ray.core.memory.check_fit)."""


# -- a cluster or service failed (exit 1) -------------------------------------------------------------
class ClusterError(MilesRayError):
    """A cluster or service (Kubernetes, Polyaxon, Ray) is missing, unreachable or refused.

    ``status`` carries the HTTP status when there was one. Prefer a subclass: callers branch on the
    type, never on the message."""

    exit_code = EXIT_SERVICE

    def __init__(self, message: str, hint: str | None = None, status: int | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


class Unreachable(ClusterError):
    """The service did not answer (connection refused, DNS, TLS, timeout on connect, 5xx after retries)."""


class NotFound(ClusterError):
    """The object (cluster, run, job, namespace, CRD, project) does not exist."""


class Conflict(ClusterError):
    """The object changed or already exists in a different form (HTTP 409, a lost race)."""


class Forbidden(ClusterError):
    """Credentials missing or not allowed (HTTP 401/403)."""


class Invalid(ClusterError):
    """The server refused what we sent as invalid (HTTP 400/422): bad input, so exit 2."""

    exit_code = EXIT_BAD_INPUT


class TimedOut(ClusterError):
    """A bounded wait ran out; the message says what was still missing."""


class TransferFailed(ClusterError):
    """A copy off a run's storage failed part way (a file changed while read, the disk filled): what was copied
    and verified stays, the same command resumes."""


# -- outcomes of jobs and checks --------------------------------------------------------------------------
class JobFailed(MilesRayError):
    """The job ended FAILED (exit 3)."""

    exit_code = EXIT_JOB_FAILED


class ChecksFailed(MilesRayError):
    """A check ran and found problems (exit 4); the report was printed before this is raised."""

    exit_code = EXIT_CHECKS_FAILED


class Interrupted(MilesRayError):
    """Ctrl-C / SIGINT while waiting: says what was left in place and how to resume (exit 130)."""

    exit_code = EXIT_INTERRUPTED


_PLAIN: list[tuple[str, str]] = [
    (r"^Value error, ", ""),
    (r"^Assertion failed, ", ""),
    (r"^'([^']*)' is not one of (.+?)\.?$", r"must be one of \2 (got '\1')"),
    (r"^Input should be greater than or equal to (\S+)$", r"must be at least \1"),
    (r"^Input should be less than or equal to (\S+)$", r"must be at most \1"),
    (r"^Input should be greater than (\S+)$", r"must be more than \1"),
    (r"^Input should be less than (\S+)$", r"must be less than \1"),
    (r"^Input should be a valid integer.*$", "must be a whole number"),
    (r"^Input should be a finite number$", "must be a finite number"),
    (r"^Input should be a valid number.*$", "must be a number"),
    (r"^Input should be a valid boolean.*$", "must be true or false"),
    (r"^Input should be a valid string$", "must be text"),
    (r"^Input should be a valid list$", "must be a list"),
    (r"^Input should be a valid dictionary.*$", "must be a mapping (key: value)"),
    (r"^Input should be (.+)$", r"must be \1"),
    (r"^String should have at most (\d+) characters?$", r"must be at most \1 characters"),
    (r"^String should have at least (\d+) characters?$", r"must be at least \1 characters"),
    (r"^String should match pattern (.+)$", r"must match \1"),
    (r"^List should have at most (\d+) items?.*$", r"must have at most \1 item(s)"),
    (r"^List should have at least (\d+) items?.*$", r"must have at least \1 item(s)"),
    (r"^Field required$", "is required"),
    (r"^Option '(\S+)' requires an argument\.?$", r"\1 needs a value"),
    (r"^Extra inputs are not permitted$", "is not a known key"),
]


def plain(message: str) -> str:
    """A validator's message (pydantic's, or Typer's wording of it) in miles-ray's own words, one line:
    ``Input should be greater than or equal to 1`` -> ``must be at least 1``,
    ``Value error, 'xml' is not one of 'table', 'json'`` -> ``must be one of 'table', 'json' (got 'xml')``."""
    text = " ".join(str(message).split())
    for pattern, repl in _PLAIN:
        text = re.sub(pattern, repl, text)
    return text


def from_http_status(status: int | None, message: str, hint: str | None = None) -> ClusterError:
    """The typed error for an HTTP status (adapters use this instead of building ClusterError by hand)."""
    if status in (401, 403):
        return Forbidden(message, hint, status)
    if status == 404:
        return NotFound(message, hint, status)
    if status == 409:
        return Conflict(message, hint, status)
    if status in (400, 422):
        return Invalid(message, hint, status)
    if status is None or status in (408, 429) or status >= 500:
        return Unreachable(message, hint, status)
    return ClusterError(message, hint, status)
