"""CLI start-up and render cost, measured side by side in one run.

Prints the median wall time of `miles-ray --help` and `miles-ray plan` as a ratio to
`python -c "import typer, rich"` (the floor any Typer+Rich CLI pays), and render time for 4 and 512 nodes
(in-process build + validation, and the whole CLI). The start-up commands run interleaved, one of each per
round, so a busy machine slows them alike. The target for `miles-ray --help` is at most 1.5x the floor.
Run: .venv/bin/python benchmarks/bench_cli.py (REPEAT=N rounds, default 9)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).parent / "miles-ray")
IMAGE = "radixark/miles:latest@sha256:" + "3f" * 32
# Qwen3-4B's GBS 256 caps data parallelism at 256, so 512 nodes need a disaggregated split.
LAYOUT = {4: [], 512: ["--layout", "disaggregated", "--rollout-nodes", "448"]}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_")}


def wall(cmd: list[str], repeat: int, expect: int = 0) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd="/tmp").returncode
        times.append(time.perf_counter() - t)
        if rc != expect:
            raise SystemExit(f"{' '.join(cmd)} exited {rc}, expected {expect}")
    return statistics.median(times)


def interleaved(cmds: dict[str, tuple[list[str], int]], repeat: int) -> dict[str, float]:
    """Median wall time of each command, run round-robin (one of each per round) ``repeat`` times."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, (cmd, expect) in cmds.items():
            times[name].append(wall(cmd, 1, expect))
    return {name: statistics.median(t) for name, t in times.items()}


HELP_TARGET = 1.5


def main() -> None:
    repeat = int(os.environ.get("REPEAT", "9"))
    floor_name = "python -c 'import typer, rich'"
    startup = interleaved({
        "python -c 'pass'": ([sys.executable, "-c", "pass"], 0),
        floor_name: ([sys.executable, "-c", "import typer, rich"], 0),
        "miles-ray --help": ([EXE, "--help"], 0),
        "miles-ray plan --help": ([EXE, "plan", "--help"], 0),
        "miles-ray plan -N 4": ([EXE, "plan", "-N", "4"], 0),
        "miles-ray plan -N 3 (infeasible, suggestions)": ([EXE, "plan", "-N", "3"], 2),
    }, repeat)
    floor = startup[floor_name]
    rows = list(startup.items())
    for n in (4, 512):
        rows.append((f"miles-ray render -F kuberay -N {n}",
                     wall([EXE, "render", "-F", "kuberay", "-N", str(n), *LAYOUT[n], "--image", IMAGE,
                           "--ray-version", "2.60.0"], 3)))
    rows.append(("miles-ray render -F all -N 4 (polyaxon import)",
                 wall([EXE, "render", "-F", "all", "-N", "4", "--image", IMAGE, "--ray-version", "2.60.0"], 3)))
    print(f"{'command':48} {'median s':>9} {'x typer+rich':>13}")
    for name, t in rows:
        print(f"{name:48} {t:9.3f} {t / floor:13.2f}")
    ratio = startup["miles-ray --help"] / floor
    print(f"miles-ray --help / import typer, rich = {ratio:.2f} (target <= {HELP_TARGET}; median of {repeat} "
          f"interleaved runs): {'ok' if ratio <= HELP_TARGET else 'OVER'}")
    # in-process: build + validate only (no interpreter start)
    sys.path.insert(0, str(REPO))
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.core.builders import build_raycluster
    from miles_ray.core.config import load_config
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN

    validate_raycluster(build_raycluster(load_config({}, environ={}), plan_split(BUILTIN["Qwen3-4B"], 1, 8), IMAGE, "2.60.0"))
    for n in (4, 512):
        t = time.perf_counter()
        for _ in range(20):
            cfg = load_config({"nodes": n}, environ={})
            plan = plan_split(BUILTIN["Qwen3-4B"], n, 8, *(("disaggregated", 448) if n == 512 else ()))
            assert plan.feasible
            validate_raycluster(build_raycluster(cfg, plan, IMAGE, "2.60.0"))
        print(f"in-process plan+build+validate, {n:3} nodes: {(time.perf_counter() - t) / 20 * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
