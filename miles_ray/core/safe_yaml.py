"""YAML loading that refuses what a config file never needs: huge files, aliases (YAML bombs), tags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miles_ray.core.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: a config or recipe file is a few KiB


def parse_yaml(text: str, source: str) -> Any:
    import yaml

    class _NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ConfigError(
                    f"{source}: YAML aliases (*{event.anchor}) are not allowed",
                    hint="write the value out; aliases are refused to stop YAML bombs",
                )
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - SafeLoader subclass
    except ConfigError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}:{where}: not valid YAML: {problem}") from None


def load_yaml_file(path: str | Path, what: str = "file") -> Any:
    p = Path(path)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise ConfigError(f"{what} {p} is not a regular file")
        if size > MAX_BYTES:
            raise ConfigError(f"{what} {p} is {size} bytes; the limit is {MAX_BYTES}")
        with p.open("rb") as fh:  # never more than the limit, even if the file grows after stat()
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError(f"{what} {p} is larger than the limit of {MAX_BYTES} bytes")
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {p} is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(f"{what} {p} is not readable (permission denied)") from None
    except (OSError, ValueError) as e:  # name too long, embedded NUL, not a directory, ...
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"{what} {str(p)[:200]} cannot be read ({reason})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {p} is not UTF-8 text") from None
    return parse_yaml(text, f"{what} {p}")
