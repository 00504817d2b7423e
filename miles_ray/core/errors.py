"""Errors that the CLI turns into one clear line and an exit code (never a traceback)."""

from __future__ import annotations


class MilesRayError(Exception):
    """Base error. ``exit_code`` 2 means bad input; 1 means the cluster or a service failed us."""

    exit_code: int = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        from miles_ray.core.secrets import redact

        # an error line may echo what the user typed: never a credential (it ends up in CI logs)
        message, hint = redact(message), redact(hint) if hint else hint
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ConfigError(MilesRayError):
    """Bad configuration: flags, env vars, config file, recipe file."""


class SpecError(MilesRayError):
    """A generated or given spec is invalid (Polyaxon or KubeRay schema)."""


class PlanError(MilesRayError):
    """The requested split is infeasible; carries the violated rules."""

    def __init__(self, message: str, violations: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.violations = violations or []


class ClusterError(MilesRayError):
    """A cluster or service (Kubernetes, Polyaxon, Ray) is missing, unreachable or refused."""

    exit_code = 1


class Interrupted(MilesRayError):
    """Ctrl-C / SIGINT while waiting: says what was left in place and how to resume (exit 130)."""

    exit_code = 130
