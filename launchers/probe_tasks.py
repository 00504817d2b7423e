"""Where a probe's tasks run (imported by the probe drivers: check_data.py, comm_check.py, miles_commit.py,
list_checkpoints.py).

A job's runtime env (its working_dir, this directory, and its env vars) is every task's by default, so Ray starts
new workers for the job on every node and sets that env up for them before the first task runs. The probes' tasks
and actors need none of it: they are functions and classes of the driver's own script (sent by value) and get what
they check as arguments. Dropped from the job config the driver connects with (``ray.init`` reads it from the
variable below, set by Ray's job supervisor), the tasks run in the plain workers each node already has: about 4 s
less per probe job on the 5-node embedded cluster. The driver itself keeps both (already applied to its process).
Standard library only."""

from __future__ import annotations

import json
import os

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # Ray's job supervisor: the job config (runtime_env, metadata) as JSON


def without_the_jobs_runtime_env() -> None:
    """Call before ``ray.init()``. The job config keeps everything else (its metadata ties the driver to the
    submission). Nothing to do outside a Ray job."""
    raw = os.environ.get(JOB_CONFIG_ENV)
    if not raw:
        return
    try:
        config = json.loads(raw)
    except ValueError:
        return
    if isinstance(config, dict) and config.get("runtime_env"):
        config["runtime_env"] = {}
        os.environ[JOB_CONFIG_ENV] = json.dumps(config)
