"""`miles-ray up --backend local --nodes 4` on a heavily loaded machine (a real fault: load, not a fake).

Named ``zz`` to run last in its tier: by then the session's shared Ray cluster has been stopped
(tests/infra/fixtures.py stops each shared component after its last user), so the load is mostly the one made here.

Beside the real CLI (a child process) run: CPU burners (3 busy processes on this 2-core machine), a
memory-heavy job (allocates and keeps touching 3 GiB) and a disk-heavy job (writes and fsyncs 300 MB
in a loop). Each load process ends by itself after a bound and is killed by PID in a ``finally``.
The outcome is asserted, never a duration: ``up`` succeeds (its per-node retries may be used and
are counted), ``status`` shows 4 ALIVE workers x 8 GPUs, ``down`` leaves no process and no state.

How much load: about 2.5 runnable processes per core (3 burners and the memory job, which also burns CPU). Ray
itself bounds what a node survives: ``ray start`` gives up when its raylet has not registered within a fixed 30 s,
and the raylet registers only once its dashboard agent (a Python process) answers. With 4 burners (load ~6 on 2
cores) a slow CI machine saw all 3 head attempts hit that wait; that is Ray's limit, not a retry miles-ray lacks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

NODES, GPUS = 4, 8
CPU_BURNERS = 3
MEMORY_GIB = 3
DISK_MB = 300
LOAD_BOUND_SECONDS = 1500  # every load process exits by itself after this, whatever happens to the test
UP_TIMEOUT_SECONDS = 1200

BURN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"
HOG = (
    "import sys, time\n"
    "n, end = int(sys.argv[1]) << 30, time.time() + float(sys.argv[2])\n"
    "buf = bytearray(n)\n"
    "while time.time() < end:\n"
    "    for i in range(0, n, 4096):\n"
    "        buf[i] = (buf[i] + 1) & 255\n"
)
DISK = (
    "import os, sys, time\n"
    "path, mb, end = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])\n"
    "chunk = os.urandom(1 << 20)\n"
    "while time.time() < end:\n"
    "    with open(path, 'wb') as fh:\n"
    "        for _ in range(mb):\n"
    "            fh.write(chunk)\n"
    "        fh.flush()\n"
    "        os.fsync(fh.fileno())\n"
    "    os.remove(path)\n"
)


def start_load(workdir: Path, seconds: float = LOAD_BOUND_SECONDS) -> list[subprocess.Popen]:
    """CPU burners, a memory hog and a disk writer, each bounded to ``seconds`` (also used by the benchmark)."""
    py = [sys.executable, "-c"]
    procs = [subprocess.Popen([*py, BURN, str(seconds)]) for _ in range(CPU_BURNERS)]
    procs.append(subprocess.Popen([*py, HOG, str(MEMORY_GIB), str(seconds)]))
    procs.append(subprocess.Popen([*py, DISK, str(workdir / "disk-load.bin"), str(DISK_MB), str(seconds)]))
    return procs


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def wait_for_load(procs: list[subprocess.Popen], workdir: Path, timeout: float = 300) -> None:
    """Until the memory hog holds its memory and the disk writer has started writing (all still running)."""
    hog, deadline = procs[CPU_BURNERS], time.monotonic() + timeout
    while not (_rss_bytes(hog.pid) >= 0.95 * (MEMORY_GIB << 30) and (workdir / "disk-load.bin").exists()):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"the load did not build up within {timeout:.0f}s")
        time.sleep(0.2)


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)


def test_local_up_of_4_nodes_succeeds_on_a_heavily_loaded_machine(tmp_path, ledger):
    from miles_ray.adapters import local_ray as lr
    from tests.reliability.conftest import child_env, cli_proc

    state = tmp_path / "state"
    cluster_dir = state / "local"
    name = f"busy-{os.getpid()}"
    env = child_env(MILES_RAY_STATE_DIR=str(state))
    event = ledger.record("fault", f"busy machine: up --backend local --nodes {NODES}")  # ok: the test's outcome
    load = start_load(tmp_path)
    try:
        wait_for_load(load, tmp_path)
        load_avg = os.getloadavg()[0]
        t0 = time.monotonic()
        up = cli_proc(["up", "--backend", "local", "--nodes", str(NODES), "-G", str(GPUS), "--name", name,
                       "--timeout", str(UP_TIMEOUT_SECONDS)], env, tmp_path)
        _, up_err = up.communicate(timeout=UP_TIMEOUT_SECONDS + 120)
        up_seconds = round(time.monotonic() - t0, 1)
        retries = [ln for ln in up_err.splitlines() if "did not start (attempt" in ln]
        still_loaded = all(p.poll() is None for p in load)

        st = cli_proc(["status", "--backend", "local", "--name", name, "-o", "json"], env, tmp_path)
        st_out, st_err = st.communicate(timeout=300)
        status = json.loads(st_out) if st.returncode == 0 else {}
        workers = [(n["index"], n["gpus"], n["state"]) for n in status.get("nodes", []) if not n["is_head"]]
        heads = [n for n in status.get("nodes", []) if n["is_head"]]

        recorded = lr.read_state(cluster_dir, name) or {}
        sessions = [*lr.processes_of(recorded), *lr.job_sessions_of(recorded)] if recorded else []
        down = cli_proc(["down", "--backend", "local", "--name", name], env, tmp_path)
        _, down_err = down.communicate(timeout=300)
        left = sorted({pid for rec in sessions for pid in lr.session_members(rec)})
        temp_dir = recorded.get("temp_dir")

        event.update(up_seconds=up_seconds, retries=len(retries), load_average=round(load_avg, 1))
        print(f"busy machine: up {up_seconds}s at load {load_avg:.1f}, {len(retries)} node retries", *retries,
              sep="\n  ")

        assert up.returncode == 0, up_err
        assert still_loaded, "the load ended before up did: the test proved nothing"
        assert st.returncode == 0, st_err
        assert workers == [(i, float(GPUS), "ALIVE") for i in range(1, NODES + 1)], status
        assert len(heads) == 1 and heads[0]["gpus"] == 0, status
        assert down.returncode == 0, down_err
        assert len(sessions) == NODES + 1 and not left, (sessions, left)
        assert not lr.state_path(cluster_dir, name).exists()
        assert temp_dir and not Path(temp_dir).exists()
    finally:
        stop_load(load)
        if lr.state_path(cluster_dir, name).exists():
            lr.down(cluster_dir, name)
