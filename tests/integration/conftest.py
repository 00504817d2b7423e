"""Fixtures for integration tests against real components that run on this machine.

``polyaxon_server`` (session scope): the real Polyaxon API server (``haupt sandbox``, 2.18.0) in
its own venv (``scripts/haupt-venv.sh``, cached in ``${MILES_RAY_CACHE:-~/.cache/miles-ray}``),
on 127.0.0.1 and a free port, with the ``miles-data`` connection registered; stopped by PID.
Skips loudly when the venv cannot be created or the server cannot start, unless
``MILES_RAY_REQUIRE_E2E=1`` (then the tests fail).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.infra import haupt






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


# ---------------------------------------------------------------------------------------------
# local_ray: a real 4-node x 8 fake-GPU Ray cluster from separate `ray start` processes
# ---------------------------------------------------------------------------------------------

LOCAL_RAY_NODES = 4
LOCAL_RAY_GPUS = 8


class LocalRayCluster:
    """Handle on the session's local Ray cluster (``miles_ray.adapters.local_ray``)."""

    def __init__(self, state_dir: Path, name: str, info: dict) -> None:
        self.state_dir = state_dir
        self.name = name
        self.info = info
        self.address: str = info["dashboard_url"]

    def status(self) -> dict:
        from miles_ray.adapters import local_ray

        return local_ray.status(self.state_dir, self.name)

    def pids(self) -> list[int]:
        from miles_ray.adapters import local_ray

        return local_ray.cluster_pids(self.state_dir, self.name)


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    """Head (0 GPUs) + 4 worker raylets x 8 fake GPUs, each its own ``ray start`` process;
    stopped at the end by PID (never ``ray stop``), with a check that nothing is left."""
    from miles_ray.adapters import local_ray as lr

    state_dir = tmp_path_factory.mktemp("local-ray-state")
    name = f"pytest-{os.getpid()}"
    info = lr.up(state_dir, name, LOCAL_RAY_NODES, LOCAL_RAY_GPUS, LOCAL_RAY_GPUS, timeout=240)
    cluster = LocalRayCluster(state_dir, name, info)
    try:
        yield cluster
    finally:
        state = lr._read_state(state_dir, name)
        if state is not None:
            procs = lr._all_procs(state)
            try:
                lr.down(state_dir, name)
            finally:
                left = sorted({pid for p in procs for pid in lr.session_members(p)})
                assert not left, f"local Ray processes left after down: {left}"
                assert not Path(state["temp_dir"]).exists(), "local Ray temp dir left after down"


@pytest.fixture
def env(local_ray, monkeypatch, tmp_path):
    """The session's local Ray cluster, with this test's own state dir and cwd and no MILES_RAY_*/RAY_ADDRESS
    from the developer's shell."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + ["RAY_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    return local_ray
