#!/usr/bin/env python3
"""Benchmark: a supervised run carried through a lost worker pod, then one through a lost head pod, on real pods (KubeRay on real kubelets +
containerd, tests/infra/realpods.py), through the miles-ray CLI as a user runs it.

Brings up the real-pod cluster and ``up --via kuberay --nodes 2`` (tests/realpods/test_supervised_runs.py's
``bring_up``), submits the FAKE checkpointing trainer (steps of ~1 s on Ray actors on both GPU workers, a
checkpoint every K steps) with ``--max-restarts 3``, deletes a worker pod (grace 0) once the run trained past its
first checkpoint, and measures: seconds from the pod deleted to attempt 2's first training step, training steps
lost (trained again after the resume: at most K), and the supervisor pod's requests and measured RSS. Prints a
table, the ratios to the targets (resumed <= 60 s, lost <= K steps, requests <= 0.1 CPU / 256 MiB) and
``BENCH_RESULT {json}``. Needs root (network and mount namespaces) and the cached binaries and image
(cluster/build.sh real-nodes).

    .venv/bin/python benchmarks/bench_supervised.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.infra.realpods import start_real_pods  # noqa: E402
from tests.realpods.test_supervised_runs import K, bring_up, head_loss, worker_loss  # noqa: E402

TARGETS = {"worker_deleted_to_training_resumed_s": 60.0, "steps_lost": float(K), "supervisor_rss_mib": 256.0,
           "head_deleted_to_training_resumed_s": 60.0, "head_loss_steps_lost": float(K)}


def cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else float(quantity) / 2**20


def main() -> int:
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-supervised-") as d:
        t = time.monotonic()
        rp = start_real_pods(Path(d) / "realpods")
        out["real_pods_up_s"] = round(time.monotonic() - t, 1)
        try:
            live = bring_up(rp, Path(d) / "work")
            out["up_to_workers_in_ray_s"] = live.up_s
            got = worker_loss(live, "bench-workerloss")
            out.update(got["figures"])
            out["status"] = got["status"]["status"]
            out["attempts"] = len(got["status"]["attempts"])
            requests = got["supervisor_pod"].spec.containers[0].resources.requests
            out["supervisor_requests"] = requests
            out["supervisor_requested_cpu"] = cpu(requests["cpu"])
            out["supervisor_requested_mib"] = mib(requests["memory"])
            head = head_loss(live, "bench-headloss")  # the cluster is GCS fault tolerant (bring_up: --gcs-ft)
            out.update(head["figures"])
            out["head_loss_status"] = head["status"]["status"]
            out["workers_restarted_by_head_loss"] = head["after"] != head["before"]
            live.down()
        finally:
            td = rp.stop()
            out["teardown_s"] = round(td.seconds, 1)
    ratios = {k: round(out[k] / v, 2) for k, v in TARGETS.items() if out.get(k) is not None}
    ratios["supervisor_requested_cpu"] = round(out["supervisor_requested_cpu"] / 0.1, 2)
    ratios["supervisor_requested_mib"] = round(out["supervisor_requested_mib"] / 256, 2)
    print(f"{'figure':<42} {'value':>10} {'target':>8} {'ratio':>6}")
    for k in ("worker_deleted_to_training_resumed_s", "steps_lost", "head_deleted_to_training_resumed_s",
              "head_loss_steps_lost", "supervisor_rss_mib", "supervisor_requested_cpu", "supervisor_requested_mib"):
        target = TARGETS.get(k, {"supervisor_requested_cpu": 0.1, "supervisor_requested_mib": 256.0}.get(k))
        print(f"{k:<42} {out.get(k)!s:>10} {target!s:>8} {ratios.get(k)!s:>6}")
    print(f"worker loss: run {out['status']} after {out['attempts']} attempt(s); head loss: run "
          f"{out['head_loss_status']}, workers restarted: {out['workers_restarted_by_head_loss']}; K = {K}")
    print("BENCH_RESULT " + json.dumps({"figures": out, "ratios_to_target": ratios}, sort_keys=True))
    ok = (out["status"] == "SUCCEEDED" and out["head_loss_status"] == "SUCCEEDED"
          and not out["workers_restarted_by_head_loss"] and all(r <= 1 for r in ratios.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
