"""miles-ray compare: placeholder until its issue lands (owned by the engineer building it)."""

from __future__ import annotations

from miles_ray.core.errors import ConfigError


def compare_cmd() -> None:
    """Not available yet."""
    raise ConfigError("'compare' is not available in this build yet")
