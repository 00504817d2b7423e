"""Loading the configuration: flags > ``MILES_RAY_*`` environment variables > ``miles-ray.yaml`` > defaults, unknown
keys an error in every source, a bad value named by where it came from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miles_ray.core.config.model import MilesRayConfig
from miles_ray.core.errors import ConfigError, plain
from miles_ray.core.safe_yaml import load_yaml_file

ENV_PREFIX = "MILES_RAY_"
CONFIG_FILE = "miles-ray.yaml"
# MILES_RAY_* variables that are not config keys.
NON_CONFIG_ENV = {"CONFIG", "STATE_DIR"}

FIELDS = set(MilesRayConfig.model_fields)
_COMPLEX = {"node_selector", "tolerations", "env", "secret_env"}


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    import json

    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        field = key[len(ENV_PREFIX):].lower()
        suffix = key[len(ENV_PREFIX):]
        if suffix in NON_CONFIG_ENV:
            continue
        if field not in FIELDS:
            raise ConfigError(f"unknown environment variable {key}",
                              hint=f"config keys are: {', '.join(sorted(FIELDS))}")
        if field in _COMPLEX:
            try:
                out[field] = json.loads(raw)
            except ValueError:
                raise ConfigError(f"{key} must be JSON (e.g. '{{\"key\": \"value\"}}')") from None
        else:
            out[field] = raw
    return out


def find_config_file(explicit: str | None, environ: Mapping[str, str]) -> Path | None:
    if explicit:
        return Path(explicit)
    if environ.get(ENV_PREFIX + "CONFIG"):
        return Path(environ[ENV_PREFIX + "CONFIG"])
    default = Path(CONFIG_FILE)
    return default if default.is_file() else None


def load_config(flags: Mapping[str, Any] | None = None, config_file: str | None = None,
                environ: Mapping[str, str] | None = None) -> MilesRayConfig:
    """Merge flags > env > file > defaults into one validated config. Raises ConfigError."""
    environ = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = set(flags) - FIELDS
    if unknown:
        raise ConfigError(f"unknown config keys from flags: {sorted(unknown)}")
    path = find_config_file(config_file, environ)
    file_values: dict[str, Any] = {}
    if path is not None:
        data = load_yaml_file(path, what="config file")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must be a mapping of keys to values")
        bad = sorted(str(k) for k in data if k not in FIELDS)
        if bad:
            import difflib

            near = difflib.get_close_matches(bad[0], list(FIELDS), n=1)
            raise ConfigError(f"config file {path}: unknown key(s) {', '.join(bad)}",
                              hint=f"did you mean {near[0]!r}?" if near else "see 'miles-ray init' for the keys")
        file_values = data
    env_values = _env_values(environ)
    merged = {**file_values, **env_values, **flags}
    try:
        return MilesRayConfig.model_validate(merged)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        if field in flags:
            source = f"--{field.replace('_', '-')}"
        elif field in env_values:
            source = ENV_PREFIX + field.upper()
        elif field in file_values:
            source = f"{field} in {path}"
        else:
            source = field or "config"
        loc = ".".join(str(p) for p in err["loc"][1:])
        raise ConfigError(f"{source}{'.' + loc if loc else ''}: {plain(str(err['msg']))}") from None
