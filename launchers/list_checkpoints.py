#!/usr/bin/env python3
"""List a run's checkpoints: runs AS a short Ray job (``miles-ray register``, before anything is registered).

``list_checkpoints.py ROOT [PATH ...]``: one task with 0.01 CPU is scheduled on a GPU worker (the nodes that
write checkpoints; the head advertises no CPUs, so the task cannot land there); it lists ``ROOT`` (the run's
checkpoint dir, from its run record: the ``--save`` of its job): the ``iter_*`` directories and ``latest_checkpointed_iteration.txt``, and says
whether each PATH is a directory. When no worker has room within 30 s, the listing runs on the driver itself.

Iterations are Miles' numbering (``save(rollout_id)`` -> ``iter_<rollout_id:07d>``): ``iter_N`` holds rollout N trained,
``iter_0000000`` (rollout 0) is a real checkpoint.

Last line: ``MILES_RAY_PROBE_RESULT {json}`` with ``root``, ``exists``, ``iterations``, ``latest``, ``paths``,
``host``, ``ip`` and ``where`` (which node answered). Imports only ray and the standard library.
"""

from __future__ import annotations

import json
import os
import socket
import sys

RESULT_PREFIX = "MILES_RAY_PROBE_RESULT "
WORKER_WAIT_SECONDS = 30


def listing(root: str, paths: list[str]) -> dict:
    out: dict = {"host": socket.gethostname(), "root": root, "exists": os.path.isdir(root), "iterations": [],
                 "latest": None, "paths": {p: os.path.isdir(p) for p in paths}}
    if out["exists"]:
        for name in sorted(os.listdir(root)):
            if name.startswith("iter_") and name[5:].isdigit() and os.path.isdir(os.path.join(root, name)):
                out["iterations"].append(int(name[5:]))
        try:
            with open(os.path.join(root, "latest_checkpointed_iteration.txt")) as fh:
                out["latest"] = fh.read().strip()
        except OSError:
            pass
    try:
        import ray

        out["ip"] = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the address is evidence only
        out["ip"] = None
    return out


def main(argv: list[str]) -> int:
    root, paths = argv[0], argv[1:]
    result = None
    try:
        import ray

        from probe_tasks import without_the_jobs_runtime_env

        without_the_jobs_runtime_env()  # the tasks run in the nodes' plain workers (probe_tasks.py)
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        ref = ray.remote(num_cpus=0.01)(listing).remote(root, paths)
        ready, _ = ray.wait([ref], timeout=WORKER_WAIT_SECONDS)
        if ready:
            result = ray.get(ref)
            result["where"] = f"worker {result.get('ip')} ({result['host']})"
    except Exception:  # noqa: BLE001 - fall back to listing on the driver
        result = None
    if result is None:
        result = listing(root, paths)
        result["where"] = f"driver {result.get('ip')} (no worker had room within {WORKER_WAIT_SECONDS}s)"
    # one write call: print() writes the text and its newline separately, and Ray's log thread
    # prints the workers' lines to this stdout in between
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
