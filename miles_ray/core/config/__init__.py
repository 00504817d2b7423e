"""One configuration model for a cluster and a run; the same object feeds head, workers and submitter.

Sources, highest precedence first: command-line flags, ``MILES_RAY_*`` environment variables, a
``miles-ray.yaml`` file, defaults. Unknown keys are an error in every source.

The package's parts, by topic: ``values`` (value forms: quantities, names, the Redis address), ``model`` (the
keys and their checks), ``loading`` (the sources merged) and ``starter`` (what ``init`` writes). Import from here.
"""

from __future__ import annotations

from miles_ray.core.config.loading import CONFIG_FILE, ENV_PREFIX, FIELDS, NON_CONFIG_ENV, find_config_file, load_config
from miles_ray.core.config.model import GPU_TOLERATION, MilesRayConfig, Toleration
from miles_ray.core.config.starter import STARTER
from miles_ray.core.config.values import (GCS_FT_PASSWORD_KEY, NO_PASSWORD, cpu_millis, parse_password_secret,
                                          parse_redis_address)

__all__ = ["CONFIG_FILE", "ENV_PREFIX", "FIELDS", "GCS_FT_PASSWORD_KEY", "GPU_TOLERATION", "NON_CONFIG_ENV",
           "NO_PASSWORD", "STARTER", "MilesRayConfig", "Toleration", "cpu_millis", "find_config_file", "load_config",
           "parse_password_secret", "parse_redis_address"]
