"""Durations as people write them on a command line: ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``; a bare number is
seconds. Pure."""

from __future__ import annotations

import re

from miles_ray.core.errors import ConfigError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str, option: str = "duration") -> float:
    """Seconds in ``text``; ``ConfigError`` naming ``option`` when it is not a positive duration."""
    t = (text or "").strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    elif t and _PART.sub("", t) == "" and re.fullmatch(r"(\d+(\.\d+)?[smhd])+", t):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))
    else:
        raise ConfigError(f"{option} {text!r} is not a duration", hint="write it like 90s, 30m, 2h, 1d or 1h30m")
    if seconds <= 0:
        raise ConfigError(f"{option} {text!r} must be more than zero", hint="write it like 90s, 30m, 2h or 1d")
    return seconds
