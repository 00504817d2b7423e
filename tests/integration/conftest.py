"""Fixtures for integration tests against real components that run on this machine.

``polyaxon_server`` (session scope): the real Polyaxon API server (``haupt sandbox``, 2.18.0) in
its own venv (``scripts/haupt-venv.sh``, cached in ``${MILES_RAY_CACHE:-~/.cache/miles-ray}``),
on 127.0.0.1 and a free port, with the ``miles-data`` connection registered; stopped by PID.
Skips loudly when the venv cannot be created or the server cannot start, unless
``MILES_RAY_REQUIRE_E2E=1`` (then the tests fail).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

_HAUPT_PY = Path(__file__).resolve().parents[1] / "infra" / "haupt.py"


def _load_haupt():
    name = "miles_ray_tests_haupt"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HAUPT_PY)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


haupt = _load_haupt()


def _polyaxon_required() -> bool:
    return os.environ.get("MILES_RAY_REQUIRE_E2E", "") not in ("", "0", "false", "no")


def _polyaxon_skip_or_fail(reason: str) -> None:
    if _polyaxon_required():
        pytest.fail(f"MILES_RAY_REQUIRE_E2E=1 but the Polyaxon sandbox is unavailable: {reason}", pytrace=False)
    print("\n" + "!" * 100 + f"\n!! POLYAXON SANDBOX SKIPPED: {reason}\n" + "!" * 100, file=sys.stderr)
    pytest.skip(f"Polyaxon sandbox unavailable (set MILES_RAY_REQUIRE_E2E=1 to fail instead): {reason}")


@pytest.fixture(scope="session")
def polyaxon_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running haupt sandbox: ``.host`` (http://127.0.0.1:PORT), ``.pid``, ``.start_seconds``,
    ``.rss_bytes()``, ``.connections``, ``.log_path``."""
    try:
        venv = haupt.ensure_venv()
    except haupt.HauptUnavailable as e:
        _polyaxon_skip_or_fail(str(e))
        raise  # unreachable
    workdir = tmp_path_factory.mktemp("haupt")
    try:
        server = haupt.start(venv, workdir)
    except haupt.HauptUnavailable as e:
        _polyaxon_skip_or_fail(str(e))
        raise  # unreachable
    try:
        yield server
    finally:
        server.stop()
