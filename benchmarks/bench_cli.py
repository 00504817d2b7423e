"""CLI start-up and render cost, measured side by side in one run.

Prints the median wall time of `miles-ray --help` and `miles-ray plan` as a ratio to
`python -c "import typer, rich"` (the floor any Typer+Rich CLI pays), and render time for 4 and 512 nodes
(in-process build + validation, and the whole CLI). Run: .venv/bin/python benchmarks/bench_cli.py
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


def main() -> None:
    repeat = int(os.environ.get("REPEAT", "7"))
    floor = wall([sys.executable, "-c", "import typer, rich"], repeat)
    bare = wall([sys.executable, "-c", "pass"], repeat)
    rows = [("python -c 'pass'", bare), ("python -c 'import typer, rich'", floor)]
    rows.append(("miles-ray --help", wall([EXE, "--help"], repeat)))
    rows.append(("miles-ray plan -N 4", wall([EXE, "plan", "-N", "4"], repeat)))
    rows.append(("miles-ray plan -N 3 (infeasible, suggestions)", wall([EXE, "plan", "-N", "3"], repeat, expect=2)))
    for n in (4, 512):
        rows.append((f"miles-ray render -f kuberay -N {n}",
                     wall([EXE, "render", "-f", "kuberay", "-N", str(n), *LAYOUT[n], "--image", IMAGE,
                           "--ray-version", "2.60.0"], 3)))
    rows.append(("miles-ray render -f all -N 4 (polyaxon import)",
                 wall([EXE, "render", "-f", "all", "-N", "4", "--image", IMAGE, "--ray-version", "2.60.0"], 3)))
    print(f"{'command':48} {'median s':>9} {'x typer+rich':>13}")
    for name, t in rows:
        print(f"{name:48} {t:9.3f} {t / floor:13.2f}")
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
