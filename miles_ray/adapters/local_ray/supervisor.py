"""The supervisor of a run on this machine (the embedded cluster, or a head reached from here): a detached process
(its own session: closing the terminal or the CLI exiting changes nothing) running ``supervise.py`` with this
venv's python. What it needs lives in ``<state dir>/supervisors/<run>/`` (the run record keeps that dir relative to
the state dir: a state dir moved elsewhere is read the same): ``program/`` (the shipped program,
:mod:`miles_ray.controller.program`), ``spec.json`` (its input),
``events.log`` (its stdout: one ``MILES_RAY_SUPERVISOR`` event a line), ``stderr.log``, ``process.json`` (its PID
and start time: a PID reused by another process is never signalled).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from miles_ray.adapters import state
from miles_ray.adapters.local_ray.processes import proc_stat, start_ticks
from miles_ray.adapters.ray_auth import write_token_file
from miles_ray.controller.program import write_program
from miles_ray.core.supervision import parse_events

STOP_WAIT_SECONDS = 10.0


def supervisor_dir(run: str) -> Path:
    return state.state_dir() / "supervisors" / run


class LocalSupervisor:
    """The detached supervisor process of run ``run`` (:class:`miles_ray.services.runs.supervised.SupervisorHandle`)."""

    kind = "local"

    def __init__(self, run: str, where: dict[str, Any] | None = None) -> None:
        self.run = run
        kept = (where or {}).get("dir")  # relative to the state dir; absolute in records of older miles-rays
        self.dir = state.kept_path_now(kept, f"supervisors/{run}") if kept else supervisor_dir(run)
        # the state dir it was started in, when that was moved since (its spec names files there)
        self.moved_from = Path(kept).parents[1] if kept and Path(kept).is_absolute() and Path(kept) != self.dir \
            else None

    @property
    def events_path(self) -> Path:
        return self.dir / "events.log"

    @property
    def spec_path(self) -> Path:
        return self.dir / "spec.json"

    def token_file(self, token: str) -> str:
        """A 0600 copy of the head's token for the supervisor (when it came from the environment, not a file)."""
        return str(write_token_file(self.dir / "ray-token", token))

    def head_url(self, reached: str, in_cluster: str) -> str:
        """This machine reaches the head as this process did."""
        return reached

    def start(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Write the spec, start the program detached; where it is (kept in the run record's ``supervisor``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        state.atomic_write_json(self.spec_path, spec)
        program = write_program(self.dir / "program")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.events_path, "ab") as out, open(self.dir / "stderr.log", "ab") as err:
            proc = subprocess.Popen([sys.executable, str(program), "--spec", str(self.spec_path)], stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL, cwd=str(self.dir), env=env,
                                    start_new_session=True, close_fds=True)
        ticks = start_ticks(proc.pid)
        state.atomic_write_json(self.dir / "process.json", {"pid": proc.pid, "start_ticks": ticks})
        return {"dir": state.kept_path(self.dir), "pid": proc.pid, "start_ticks": ticks}

    def restart(self) -> bool:
        """Start the supervisor again with the spec it was started with, when it is not running (it adopts the
        attempt that runs, or carries the run on). False: it runs, or it was never started here."""
        spec = state.read_json(self.spec_path)
        if self.alive() is not False or not spec:
            return False
        if self.moved_from is not None:  # the files its spec names (its token copy) moved with the state dir
            spec = _rerooted(spec, str(self.moved_from), str(state.state_dir()))
        self.start(spec)
        return True

    def _process(self) -> dict[str, Any] | None:
        return state.read_json(self.dir / "process.json")

    def events(self) -> list[dict[str, Any]]:
        try:
            return parse_events(self.events_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return []

    def alive(self) -> bool | None:
        proc = self._process()
        if not proc or proc.get("pid") is None:
            return None
        st = proc_stat(int(proc["pid"]))
        return bool(st) and st[0] not in ("Z", "X") and st[3] == proc.get("start_ticks")

    def stop(self) -> None:
        """SIGTERM (then SIGKILL after a while) to the supervisor, if it is still the process started."""
        if not self.alive():
            return
        pid = int(self._process()["pid"])
        for sig, wait in ((signal.SIGTERM, STOP_WAIT_SECONDS), (signal.SIGKILL, STOP_WAIT_SECONDS)):
            if not self.alive():
                return
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.alive():
                _reap(pid)
                time.sleep(0.05)


def _rerooted(value: Any, old: str, new: str) -> Any:
    """``value`` (a spec) with every path under ``old`` put under ``new``."""
    if isinstance(value, dict):
        return {k: _rerooted(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rerooted(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith(old.rstrip("/") + "/")):
        return new + value[len(old.rstrip("/")):]
    return value


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
