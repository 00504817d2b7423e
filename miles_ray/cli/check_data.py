"""miles-ray check-data: placeholder until its issue lands (owned by the engineer building it)."""

from __future__ import annotations

from miles_ray.core.errors import ConfigError


def check_data_cmd() -> None:
    """Not available yet."""
    raise ConfigError("'check-data' is not available in this build yet")
