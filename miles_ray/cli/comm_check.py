"""miles-ray comm-check: placeholder until its issue lands (owned by the engineer building it)."""

from __future__ import annotations

from miles_ray.core.errors import ConfigError


def comm_check_cmd() -> None:
    """Not available yet."""
    raise ConfigError("'comm-check' is not available in this build yet")
