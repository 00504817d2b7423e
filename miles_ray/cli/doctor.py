"""miles-ray doctor: placeholder until its issue lands (owned by the engineer building it)."""

from __future__ import annotations

from miles_ray.core.errors import ConfigError


def doctor_cmd() -> None:
    """Not available yet."""
    raise ConfigError("'doctor' is not available in this build yet")
