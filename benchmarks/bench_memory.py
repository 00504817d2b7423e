"""The memory estimate's cost (miles_ray/core/memory/), and `plan` start time with it, side by side in one run.

In-process: the estimate of every planned catalog recipe at every size 1..64 nodes x 8 GPUs that plans (the
issue's target: well under a second for all of them), and a misfit's checked suggestions (each one planned and
estimated before it is named). Whole processes, run round-robin (one of each per round, so a busy machine slows
them alike): `python -c 'import typer, rich'` (the floor any Typer+Rich CLI pays), `miles-ray plan --help`, and
`miles-ray plan` without GPU memory (estimated, not checked), with `--gpu-memory 80GiB` (checked), for the largest
catalog job (Qwen3-235B-A22B on 16 nodes), and a misfit refused with its suggestions; each as a ratio to the floor
and to `plan` without GPU memory. The start-up target `benchmarks/bench_cli.py` holds is 1.5x the floor for
`miles-ray --help`; `plan` itself is read against `plan --help` here (what the estimate adds to a plan).
Run: .venv/bin/python benchmarks/bench_memory.py (REPEAT=N rounds, default 9)
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
ENV = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_")}
SIZES = (1, 2, 4, 8, 16, 32, 64)


def in_process(repeat: int) -> list[tuple[str, float, str]]:
    sys.path.insert(0, str(REPO))
    from miles_ray.core.memory import MIB, estimate, suggestions
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN

    h100 = 81559 * MIB
    recipes = [r for r in BUILTIN.values() if r.plannable and r.train_backend == "megatron"]
    plans = [(r, p) for r in recipes for n in SIZES if (p := plan_split(r, n, 8, with_suggestions=False)).feasible]
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        for r, p in plans:
            estimate(r, p, gpu_bytes=h100)
        rounds.append(time.perf_counter() - t)
    all_estimates = statistics.median(rounds)
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        for r in recipes:
            for n in SIZES:
                plan_split(r, n, 8, with_suggestions=False)
        rounds.append(time.perf_counter() - t)
    all_plans = statistics.median(rounds)
    qwen = BUILTIN["Qwen3-4B"]
    plan = plan_split(qwen, 1, 8)
    est = estimate(qwen, plan, gpu_bytes=12 * 2**30)
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        suggestions(qwen, plan, est)
        rounds.append(time.perf_counter() - t)
    fixes = statistics.median(rounds)
    return [
        (f"estimate, all {len(recipes)} recipes x sizes ({len(plans)} splits)", all_estimates,
         f"{all_estimates / len(plans) * 1e3:.2f} ms each; {all_estimates / all_plans:.2f}x planning them"),
        (f"plan_split, the same {len(recipes)} recipes x {len(SIZES)} sizes", all_plans, ""),
        ("suggestions of a misfit (Qwen3-4B 1x8 on 12 GiB)", fixes, "each candidate planned and estimated"),
    ]


def wall(cmd: list[str], expect: int) -> float:
    t = time.perf_counter()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd="/tmp").returncode
    took = time.perf_counter() - t
    if rc != expect:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}, expected {expect}")
    return took


def processes(repeat: int) -> dict[str, float]:
    cmds = {
        "python -c 'import typer, rich'": ([sys.executable, "-c", "import typer, rich"], 0),
        "miles-ray plan --help": ([EXE, "plan", "--help"], 0),
        "miles-ray plan -N 1 (GPU memory unknown)": ([EXE, "plan", "-N", "1"], 0),
        "miles-ray plan -N 1 --gpu-memory 80GiB": ([EXE, "plan", "-N", "1", "--gpu-memory", "80GiB"], 0),
        "miles-ray plan Qwen3-235B-A22B -N 16 --gpu-memory H200": (
            [EXE, "plan", "--recipe", "Qwen3-235B-A22B", "-N", "16", "--gpu-memory", "H200"], 0),
        "miles-ray plan -N 1 --gpu-memory 12GiB (misfit)": ([EXE, "plan", "-N", "1", "--gpu-memory", "12GiB"], 2),
    }
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeat):
        for name, (cmd, expect) in cmds.items():
            times[name].append(wall(cmd, expect))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    repeat = int(os.environ.get("REPEAT", "9"))
    print(f"in-process (median of {repeat})")
    print(f"{'what':62} {'median s':>9}  note")
    for name, t, note in in_process(repeat):
        print(f"{name:62} {t:9.4f}  {note}")
    wall_times = processes(repeat)
    floor = wall_times["python -c 'import typer, rich'"]
    base = wall_times["miles-ray plan -N 1 (GPU memory unknown)"]
    helps = wall_times["miles-ray plan --help"]
    print(f"\nwhole processes (median of {repeat} interleaved rounds)")
    print(f"{'command':62} {'median s':>9} {'x floor':>8} {'x plan':>7}")
    for name, t in wall_times.items():
        print(f"{name:62} {t:9.3f} {t / floor:8.2f} {t / base:7.2f}")
    print(f"plan -N 1 --gpu-memory 80GiB / plan --help = {wall_times['miles-ray plan -N 1 --gpu-memory 80GiB'] / helps:.2f}"
          " (what planning and the estimate add to the verb's start-up)")


if __name__ == "__main__":
    main()
