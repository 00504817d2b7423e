#!/usr/bin/env python3
"""STAND-IN for Miles's ``train.py`` on real pods, where a LOST POD must end the job as it ends Miles': the FAKE
checkpointing trainer (``fake_ckpt_train.py``, placed beside this file: its flags, steps, checkpoints and
``--load`` resume) whose every step is work done by Ray actors that hold the GPUs of every GPU worker (one actor
per worker, ``num_gpus`` = the worker's GPUs, as Miles' trainer and rollout actors hold them). A worker pod lost
mid-step makes the step fail with Ray's own error (``RayActorError``/``ActorDiedError``), which ends the job, as it
ends a real run; no step is counted after it.

Environment (set by the test with ``submit --env``): ``MILESRAY_TEST_GPU_WORKERS`` (default 2) and
``MILESRAY_TEST_GPUS_PER_WORKER`` (default 2), plus fake_ckpt_train's own. Needs Ray (the pod image has it).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_ckpt_train  # noqa: E402  (beside this file)


def main() -> int:
    import ray

    ray.init()  # the job's driver: RAY_ADDRESS is set by the Jobs API
    workers = int(os.environ.get("MILESRAY_TEST_GPU_WORKERS", "2"))
    gpus = float(os.environ.get("MILESRAY_TEST_GPUS_PER_WORKER", "2"))

    @ray.remote(num_gpus=gpus, num_cpus=0, max_restarts=0)
    class Rank:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def step(self, seconds: float) -> str:
            time.sleep(seconds)
            return ray.get_runtime_context().get_node_id()

    ranks = [Rank.remote() for _ in range(workers)]
    nodes = ray.get([r.node.remote() for r in ranks], timeout=300)
    print(f"STAND-IN: {workers} rank actor(s) on Ray nodes {nodes}", flush=True)

    def step(seconds: float) -> None:
        ray.get([r.step.remote(seconds) for r in ranks])  # a rank lost with its pod raises Ray's error here

    fake_ckpt_train.time = SimpleNamespace(sleep=step, strftime=time.strftime)  # each step is the ranks' work
    try:
        return fake_ckpt_train.main()
    except Exception:  # noqa: BLE001 -- what Ray raised, printed as Miles' driver would print it
        traceback.print_exc()
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    sys.exit(main())
