#!/usr/bin/env python3
"""Benchmark of the local backend (one run, real Ray, fake GPUs).

Measures: ``up`` time for head + N worker raylets on a quiet machine, idle cluster memory as PSS
(sum of ``/proc/<pid>/smaps_rollup`` over every process of the cluster's node sessions -- raylets,
GCS, dashboard, agents and Ray workers), Jobs API submit-to-RUNNING latency (and to SUCCEEDED for a
trivial job), a 2-node colocated Qwen3-4B placement rehearsal (wall time and peak PSS while it
runs), and ``down`` time; then ``up`` again under the load of tests/reliability/test_zz_busy_machine.py
(CPU burners, a memory hog, an fsync loop: started, built up, killed by PID afterwards), with the node
start retries it needed. Prints a table, ratios (loaded/quiet start time among them), and a
``BENCH_RESULT {json}`` line.

    .venv/bin/python benchmarks/bench_local_ray.py [--nodes 4] [--gpus 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from miles_ray.adapters import local_ray as lr  # noqa: E402
from miles_ray.adapters import ray_jobs  # noqa: E402
from tests.reliability.test_zz_busy_machine import CPU_BURNERS, DISK_MB, MEMORY_GIB  # noqa: E402
from tests.reliability.test_zz_busy_machine import start_load, stop_load, wait_for_load  # noqa: E402

REHEARSE = REPO / "launchers" / "rehearse.py"
GIB = 1024**3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="mr-bench-state-"))
    name = "bench"
    res: dict = {"nodes": args.nodes, "gpus_per_node": args.gpus}
    res["load_average_quiet"] = round(os.getloadavg()[0], 1)  # what else runs on the machine
    t0 = time.monotonic()
    info = lr.up(state_dir, name, args.nodes, args.gpus, args.gpus, progress=lambda m: print("  " + m, flush=True),
                 timeout=900)
    res["up_s"] = round(time.monotonic() - t0, 2)
    address = info["dashboard_url"]
    try:
        time.sleep(2)  # let the agents settle before measuring idle memory (a measurement, not a wait)
        pids = lr.cluster_pids(state_dir, name)
        res["idle_processes"] = len(pids)
        res["idle_pss_gib"] = round(lr.pss_bytes(pids) / GIB, 3)
        res["idle_pss_gib_per_node"] = round(res["idle_pss_gib"] / (args.nodes + 1), 3)

        # submit -> RUNNING latency of a trivial job
        t = time.monotonic()
        job, _ = ray_jobs.submit(address, f"{sys.executable} -c \"import time; time.sleep(1); print('ok')\"")
        ray_jobs.wait(address, job, timeout=120, until=("RUNNING",), poll=0.05)
        res["submit_to_running_s"] = round(time.monotonic() - t, 2)
        final = ray_jobs.wait(address, job, timeout=120, poll=0.1)
        res["submit_to_succeeded_s"] = round(time.monotonic() - t, 2)
        assert final["status"] == "SUCCEEDED", final

        # 2-node colocated Qwen3-4B rehearsal, with PSS sampled while it runs
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], lr.pss_bytes(lr.cluster_pids(state_dir, name)))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t = time.monotonic()
        job, _ = ray_jobs.submit(
            address,
            f"{sys.executable} {REHEARSE} --colocate --actor-num-nodes 2 --actor-num-gpus-per-node 8 "
            f"--rollout-num-gpus-per-engine 2 --num-gpus-per-node 8",
        )
        final = ray_jobs.wait(address, job, timeout=600, poll=0.2)
        res["rehearsal_2node_s"] = round(time.monotonic() - t, 2)
        stop.set()
        sampler.join()
        logs = ray_jobs.logs(address, job)
        line = [ln for ln in logs.splitlines() if ln.startswith("REHEARSAL_RESULT ")][-1]
        rr = json.loads(line.split(" ", 1)[1])
        res["rehearsal_ok"] = rr["ok"] and final["status"] == "SUCCEEDED"
        res["rehearsal_actor_s"] = rr.get("seconds_actors")
        res["rehearsal_actors"] = sum((rr.get("actors") or {}).values())
        res["rehearsal_peak_pss_gib"] = round(peak[0] / GIB, 3)
    finally:
        t = time.monotonic()
        stopped = lr.down(state_dir, name)
        res["down_s"] = round(time.monotonic() - t, 2)
        res["down_force_killed"] = stopped["force_killed"]
        res["down_pids"] = stopped["pids"]

    # the same `up` beside the busy-machine test's load
    work = Path(tempfile.mkdtemp(prefix="mr-bench-load-"))
    load = start_load(work)
    lines: list[str] = []

    def said(msg: str) -> None:
        lines.append(msg)
        print("  " + msg, flush=True)

    try:
        wait_for_load(load, work)
        res["load_average_at_start"] = round(os.getloadavg()[0], 1)
        t0 = time.monotonic()
        lr.up(state_dir, name, args.nodes, args.gpus, args.gpus, progress=said, timeout=1200)
        res["up_loaded_s"] = round(time.monotonic() - t0, 2)
        res["up_loaded_retries"] = sum("did not start (attempt" in ln for ln in lines)
        t = time.monotonic()
        lr.down(state_dir, name)
        res["down_loaded_s"] = round(time.monotonic() - t, 2)
    finally:
        stop_load(load)
        if lr.state_path(state_dir, name).exists():
            lr.down(state_dir, name)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)

    print()
    load_desc = f"{CPU_BURNERS} CPU burners, {MEMORY_GIB} GiB touched, {DISK_MB} MB fsync loop"
    rows = [
        ("local up (head + %d x %d GPUs), quiet" % (args.nodes, args.gpus),
         f"{res['up_s']:.1f} s (load avg {res['load_average_quiet']} at start)"),
        ("local up, loaded", f"{res['up_loaded_s']:.1f} s ({load_desc}; load avg "
                             f"{res['load_average_at_start']} at start; {res['up_loaded_retries']} node retries)"),
        ("  down, loaded", f"{res['down_loaded_s']:.1f} s"),
        ("idle cluster PSS", f"{res['idle_pss_gib']:.2f} GiB over {res['idle_processes']} processes"),
        ("  per node", f"{res['idle_pss_gib_per_node']:.2f} GiB"),
        ("submit -> RUNNING", f"{res['submit_to_running_s']:.2f} s"),
        ("submit -> SUCCEEDED (1 s job)", f"{res['submit_to_succeeded_s']:.2f} s"),
        ("rehearsal 2-node colocated Qwen3-4B", f"{res['rehearsal_2node_s']:.1f} s ({res['rehearsal_actors']} actors)"),
        ("  peak PSS during rehearsal", f"{res['rehearsal_peak_pss_gib']:.2f} GiB"),
        ("down", f"{res['down_s']:.1f} s ({res['down_force_killed']} force-killed of {res['down_pids']})"),
    ]
    for k, v in rows:
        print(f"{k:<40} {v}")
    res["ratio_up_loaded_over_quiet"] = round(res["up_loaded_s"] / res["up_s"], 2)
    res["ratio_rehearsal_over_up"] = round(res["rehearsal_2node_s"] / res["up_s"], 2)
    res["ratio_down_over_up"] = round(res["down_s"] / res["up_s"], 3)
    res["ratio_peak_over_idle_pss"] = round(res["rehearsal_peak_pss_gib"] / res["idle_pss_gib"], 2)
    print(
        f"ratios: up loaded/quiet {res['ratio_up_loaded_over_quiet']}, rehearsal/up {res['ratio_rehearsal_over_up']}, "
        f"down/up {res['ratio_down_over_up']}, peak/idle PSS {res['ratio_peak_over_idle_pss']}"
    )
    print("BENCH_RESULT " + json.dumps(res, sort_keys=True))
    return 0 if res.get("rehearsal_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
