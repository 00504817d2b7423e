"""How each node of a local cluster is started: its ``ray start`` arguments and environment (the layout is
:mod:`miles_ray.adapters.local_ray.nodes`'s)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from miles_ray.adapters import ray_auth

HEAD_IP = "127.0.0.2"
HEAD_CPUS = 2
OBJECT_STORE_BYTES = 200_000_000
NODE_RESOURCE_PREFIX = "miles_ray_node_"
HEAD_RESOURCE = "miles_ray_head"

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_memory_monitor_refresh_ms": "0",  # every fake node would watch the same host's memory
    # Start-up waits raised for a busy machine (Ray 2.60 defaults in brackets):
    "RAY_gcs_server_port_wait_time_s": "120",  # ray start: ~1 s attempts to reach the GCS [20]
    "RAY_NUM_REDIS_GET_RETRIES": "120",  # ray start (worker): reads of the session name from the GCS [20]
    "RAY_gcs_rpc_server_connect_timeout_s": "60",  # raylet: its first connection to the GCS [5 s]
    "RAY_py_gcs_connect_timeout_s": "60",  # Python GCS clients: dashboard, agents, ray start [30 s]
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "240",  # head: the dashboard publishing its address [60 s]
    "RAY_agent_register_timeout_ms": "180000",  # raylet: its dashboard/runtime-env agents registering [30 s]
    "RAY_worker_register_timeout_seconds": "180",  # raylet: a Ray worker process registering [60 s]
    "RAY_health_check_timeout_ms": "30000",  # GCS: one health check of a raylet [10 s]; a dead one fails at once
    # Every GCS client (dashboard, raylets, agents) EXITS when the GCS has not answered for this long [60 s]; a GCS
    # starved of CPU for a minute took the head's dashboard with it (a worker then waited for a dead dashboard)
    "RAY_gcs_rpc_server_reconnect_timeout_s": "300",
}


def node_ip(index: int) -> str:
    """Head (index 0) 127.0.0.2, worker i 127.0.0.(2+i), wrapping into the third octet."""
    k = 2 + index
    return f"127.0.{k // 250}.{k % 250 + (2 if k // 250 else 0)}"


def ray_version() -> str:
    try:
        from importlib.metadata import version

        return version("ray")
    except Exception:  # noqa: BLE001
        return "unknown"


def child_env(state: dict) -> dict[str, str]:
    """The environment of every ``ray start``: ours minus any Ray address/token, plus :data:`RAY_ENV` and the
    cluster's auth: ``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN_PATH`` its token file (inherited by every Ray
    process and job driver of the node), else ``RAY_AUTH_MODE=disabled`` (explicit: never whatever token
    happens to be in ~/.ray)."""
    env = dict(os.environ)
    for key in ("RAY_ADDRESS", ray_auth.TOKEN_ENV, ray_auth.TOKEN_PATH_ENV):
        env.pop(key, None)
    env.update(RAY_ENV)
    if state.get("auth") == "token":
        env[ray_auth.MODE_ENV] = "token"
        env[ray_auth.TOKEN_PATH_ENV] = str(state["token_path"])
    else:
        env[ray_auth.MODE_ENV] = "disabled"
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def head_args(state: dict, node_name: str, gcs_port: int, dashboard_port: int, client_port: int) -> list[str]:
    return [
        "--head",
        f"--port={gcs_port}",
        f"--node-ip-address={HEAD_IP}",
        f"--node-name={node_name}",
        "--num-gpus=0",
        f"--num-cpus={int(state['head_cpus'])}",
        f"--object-store-memory={int(state['object_store_memory'])}",
        f"--temp-dir={state['temp_dir']}",
        "--include-dashboard=True",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        "--dashboard-agent-listen-port=0",  # the agent binds a port of its own choosing and publishes it
        f"--ray-client-server-port={client_port}",  # Ray starts it whenever ray[client] is installed
        f"--resources={json.dumps({HEAD_RESOURCE: 1})}",
        "--min-worker-port=0",  # OS-chosen worker ports: raylets on one host must not share a port range
        "--max-worker-port=0",
        "--disable-usage-stats",
    ]


def worker_args(state: dict, index: int, node_name: str) -> list[str]:
    return [
        f"--address={state['gcs_address']}",
        f"--node-ip-address={node_ip(index)}",
        f"--node-name={node_name}",
        f"--num-gpus={int(state['gpus_per_node'])}",
        f"--num-cpus={int(state['cpus_per_node'])}",
        f"--object-store-memory={int(state['object_store_memory'])}",
        f"--temp-dir={state['temp_dir']}",
        "--dashboard-agent-listen-port=0",
        "--include-log-monitor=False",  # the head's log monitor already reads the shared session dir
        "--min-worker-port=0",
        "--max-worker-port=0",
        f"--resources={json.dumps({f'{NODE_RESOURCE_PREFIX}{index}': 1})}",
        "--disable-usage-stats",
    ]
