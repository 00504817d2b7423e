#!/usr/bin/env python3
"""Benchmark the fake-GPU Kubernetes control plane (cluster/fakegpu.py).

    .venv/bin/python benchmarks/bench_control_plane.py [--nodes 4] [--repeat 1] [--json]

Reports: the cold build (timed now if the cache is empty, otherwise "cached" plus the times
recorded by the cold build in $MILESRAY_TEST_CACHE/build-times.tsv), the warm start time (up until
ready: apiserver /readyz, nodes Ready, CRDs Established, operator ready), memory (RSS and PSS of
every started process, summed) once ready, and the down time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_fakegpu():
    spec = importlib.util.spec_from_file_location("miles_ray_fakegpu", REPO / "cluster" / "fakegpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def mem_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB from /proc/PID/smaps_rollup."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def recorded_build_times(cache: Path) -> list[str]:
    f = cache / "build-times.tsv"
    return f.read_text().splitlines() if f.exists() else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (plus one CPU node)")
    ap.add_argument("--repeat", type=int, default=1, help="warm start/stop cycles")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait after ready before measuring memory")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--keep-dirs", action="store_true", help="keep each run's state dir and logs")
    args = ap.parse_args()

    fg = load_fakegpu()
    report: dict = {"versions": fg.read_versions(), "nodes": args.nodes}

    # Cold build
    if fg.all_cached():
        report["build"] = {"cached": True, "recorded": recorded_build_times(fg.cache_dir())}
    else:
        t = time.monotonic()
        proc = subprocess.run(["bash", str(REPO / "cluster" / "build.sh")], text=True, capture_output=True)
        report["build"] = {
            "cached": False,
            "seconds": round(time.monotonic() - t, 1),
            "rc": proc.returncode,
            "output": proc.stdout.splitlines(),
        }
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            print(json.dumps(report, indent=2))
            return 1

    runs = []
    for _ in range(args.repeat):
        d = Path(tempfile.mkdtemp(prefix="mr-bench-", dir="/tmp"))
        t = time.monotonic()
        cluster = fg.up(d, nodes=args.nodes, build=False)
        up_s = time.monotonic() - t
        try:
            time.sleep(args.settle)
            mem = {}
            for name, pid in cluster.pids.items():
                rss, pss = mem_kib(pid)
                mem[name] = {"rss_mib": round(rss / 1024, 1), "pss_mib": round(pss / 1024, 1)}
        finally:
            t = time.monotonic()
            stopped = fg.down(d)
            down_s = time.monotonic() - t
            if not args.keep_dirs:
                shutil.rmtree(d, ignore_errors=True)
        runs.append(
            {
                "up_seconds": round(up_s, 2),
                "phases": {k: round(v, 2) for k, v in cluster.state.get("timings", {}).items()},
                "memory": mem,
                "rss_total_mib": round(sum(m["rss_mib"] for m in mem.values()), 1),
                "pss_total_mib": round(sum(m["pss_mib"] for m in mem.values()), 1),
                "down_seconds": round(down_s, 2),
                "stopped": stopped,
                "dir": str(d),
            }
        )
    report["runs"] = runs

    if args.json:
        print(json.dumps(report, indent=2))
        return 0

    v = report["versions"]
    print(f"versions: kubernetes {v['KUBERNETES_VERSION']}, etcd {v['ETCD_VERSION']}, kwok {v['KWOK_VERSION']}, "
          f"kuberay {v['KUBERAY_VERSION']}")
    b = report["build"]
    if b["cached"]:
        print("cold build: cached (binaries present); times recorded by the cold build:")
        for line in b["recorded"] or ["  (none recorded)"]:
            print(f"  {line}")
    else:
        print(f"cold build: {b['seconds']:.0f}s total")
        for line in b["output"]:
            print(f"  {line}")
    for i, r in enumerate(runs):
        print(f"run {i + 1}: {args.nodes} GPU nodes + 1 CPU node")
        print(f"  warm start (up until ready): {r['up_seconds']:.1f}s   phases: {r['phases']}")
        print(f"  memory after ready (+{args.settle:.0f}s): RSS {r['rss_total_mib']:.0f} MiB, "
              f"PSS {r['pss_total_mib']:.0f} MiB")
        for name, m in r["memory"].items():
            print(f"    {name:26s} RSS {m['rss_mib']:7.1f} MiB   PSS {m['pss_mib']:7.1f} MiB")
        print(f"  down: {r['down_seconds']:.2f}s  {r['stopped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
