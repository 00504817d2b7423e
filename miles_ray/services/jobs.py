"""Moved: the runs and their jobs are :mod:`miles_ray.services.runs` (the run backends behind one dispatch) and
:mod:`miles_ray.services.runs.submit`. Kept for the modules that import ``live_status`` (and ``parse_env``,
the --env rules submit applies) from here."""

from __future__ import annotations

from miles_ray.core.submission import parse_env
from miles_ray.services.runs import live_status

__all__ = ["live_status", "parse_env"]
