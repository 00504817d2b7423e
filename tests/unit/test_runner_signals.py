"""SIGTERM to a test run tears the session's fixtures down (tests/infra/signals.py): a run stopped by a CI
timeout or by ``kill`` must not leave its real components (Ray, the Polyaxon server, the control plane)
running. Checked on a real pytest child run with a session fixture that owns a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.infra.procs import default_signals

SESSION_TEST = textwrap.dedent('''
    import os, subprocess, time
    from pathlib import Path
    import pytest

    OUT = Path(os.environ["SIGTEST_DIR"])

    @pytest.fixture(scope="session")
    def component():
        child = subprocess.Popen(["sleep", "300"])
        (OUT / "child.pid").write_text(str(child.pid))
        yield child
        (OUT / "teardown-started").write_text("")
        if os.environ.get("SIGTEST_HANG"):
            time.sleep(300)
        child.kill()
        child.wait()
        (OUT / "torn-down").write_text("")

    def test_waits(component):
        (OUT / "ready").write_text("")
        try:
            time.sleep(300)
        except KeyboardInterrupt:  # as the CLI run in-process does with Ctrl-C: exit code 130, go on
            if not os.environ.get("SIGTEST_SWALLOW"):
                raise
        (OUT / "first-done").write_text("")

    def test_after(component):
        (OUT / "second-ran").write_text("")
''')


def _wait_for(path: Path, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (already exited, not reaped by its dead parent yet) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _run(tmp_path: Path, plugin: bool, hang: bool = False, swallow: bool = False) -> subprocess.Popen:
    (tmp_path / "test_session.py").write_text(SESSION_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "SIGTEST_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    for knob, on in (("SIGTEST_HANG", hang), ("SIGTEST_SWALLOW", swallow)):
        env.pop(knob, None)
        if on:
            env[knob] = "1"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_session.py"]
    if plugin:
        args[3:3] = ["-p", "tests.infra.signals"]
    return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=default_signals)


def _sigterm(tmp_path: Path, again_after: str | None = None, **run: bool) -> tuple[subprocess.Popen, str, int]:
    """Start the child run (``_run``), SIGTERM it once its test runs -- and again once the file ``again_after``
    appears --, wait for it to end; returns it, its output and the PID of its session fixture's process."""
    proc = _run(tmp_path, **run)
    try:
        _wait_for(tmp_path / "ready")
        child = int((tmp_path / "child.pid").read_text())
        proc.send_signal(signal.SIGTERM)
        if again_after:
            _wait_for(tmp_path / again_after)
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc, out, child


@pytest.mark.parametrize("plugin", [True, False], ids=["with-plugin", "without-plugin"])
def test_sigterm_tears_the_session_down(tmp_path: Path, plugin: bool) -> None:
    proc, out, child = _sigterm(tmp_path, plugin=plugin)
    if plugin:
        assert (tmp_path / "torn-down").exists(), out
        assert not _alive(child)
        assert proc.returncode == 2, out  # pytest's "interrupted"
        assert "SIGTERM" in out, out
    else:  # what the plugin prevents: killed on the spot, the fixture's process left running
        try:
            assert proc.returncode == -signal.SIGTERM
            assert not (tmp_path / "torn-down").exists()
            assert _alive(child)
        finally:
            os.kill(child, signal.SIGKILL)


def test_sigterm_swallowed_by_the_running_test_still_stops_the_run(tmp_path: Path) -> None:
    proc, out, child = _sigterm(tmp_path, plugin=True, swallow=True)
    assert (tmp_path / "first-done").exists(), out  # the test went on after swallowing it ...
    assert not (tmp_path / "second-ran").exists(), out  # ... but no further test ran
    assert (tmp_path / "torn-down").exists() and not _alive(child), out
    assert proc.returncode == 2, out


def test_second_sigterm_kills_a_hanging_teardown(tmp_path: Path) -> None:
    proc, _, child = _sigterm(tmp_path, again_after="teardown-started", plugin=True, hang=True)
    try:
        assert proc.returncode == -signal.SIGTERM
        assert not (tmp_path / "torn-down").exists()
    finally:
        try:
            os.kill(child, signal.SIGKILL)  # the cut teardown never stopped it
        except ProcessLookupError:
            pass
