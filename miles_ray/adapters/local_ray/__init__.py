"""The embedded "local backend": a real multi-node Ray cluster on this machine.

A 0-GPU head plus N worker raylets with fake GPUs, each node its own ``ray start --block`` process
in its own session, stopped by session and PID only (never ``ray stop``, never by process name).

Modules, by responsibility:

* :mod:`.processes` -- finding (``/proc``), starting and stopping node sessions and job drivers;
* :mod:`.ports` -- the two ports fixed before the head starts, chosen where nothing else lands;
* :mod:`.state` -- the state file, its lock, the temp dir, the failure logs;
* :mod:`.nodes` -- how a node is started and judged ready, Ray's start-up settings, retries;
* :mod:`.lifecycle` -- up, status, scale, down.

The functions here take and return plain types (paths, ints, dicts) for the services and the CLI.
"""

from miles_ray.adapters.local_ray.lifecycle import (
    cluster_pids,
    down,
    job_sessions_of,
    live_pids,
    processes_of,
    scale,
    status,
    up,
)
from miles_ray.adapters.local_ray.nodes import (
    HEAD_CPUS,
    HEAD_IP,
    HEAD_RESOURCE,
    NODE_RESOURCE_PREFIX,
    OBJECT_STORE_BYTES,
    RAY_ENV,
    START_ATTEMPTS,
    Progress,
    fetch_nodes,
    node_ip,
)
from miles_ray.adapters.local_ray.ports import PREFERRED_DASHBOARD_PORT
from miles_ray.adapters.local_ray.processes import (STOP_GRACE_SECONDS, leader_alive, pss_bytes, session_members,
                                                    stop_sessions)
from miles_ray.adapters.local_ray.state import failure_log_path, read_state, state_path, token_path

__all__ = [
    "HEAD_CPUS",
    "HEAD_IP",
    "HEAD_RESOURCE",
    "NODE_RESOURCE_PREFIX",
    "OBJECT_STORE_BYTES",
    "PREFERRED_DASHBOARD_PORT",
    "RAY_ENV",
    "START_ATTEMPTS",
    "STOP_GRACE_SECONDS",
    "Progress",
    "cluster_pids",
    "down",
    "failure_log_path",
    "fetch_nodes",
    "job_sessions_of",
    "live_pids",
    "node_ip",
    "processes_of",
    "leader_alive",
    "pss_bytes",
    "read_state",
    "scale",
    "session_members",
    "state_path",
    "status",
    "stop_sessions",
    "token_path",
    "up",
]
