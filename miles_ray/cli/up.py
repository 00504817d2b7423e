"""miles-ray up: create a cluster (embedded local Ray, or KubeRay through Polyaxon) and wait until every
GPU worker has joined Ray."""

from __future__ import annotations

from rich.table import Table

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, GpusOpt, NameOpt, NodesOpt, Output, OutputOpt,
                                  TimeoutOpt, config_flags, emit, err, out, progress_display)


def nodes_table(status: dict) -> None:
    t = Table("node", "role", "state", "GPUs", "CPUs", "address", title=f"cluster {status['name']} ({status['backend']})",
              title_justify="left")
    for n in status.get("nodes", []):
        t.add_row(str(n.get("index", "")), "head" if n.get("is_head") else "gpu worker", n.get("state", ""),
                  str(n.get("gpus", 0)), str(n.get("cpus", 0)), n.get("node_ip", ""))
    out.print(t)
    out.print(f"{status['gpu_node_count']} GPU worker(s), {status['total_gpus']} GPUs, dashboard / Jobs API "
              f"{status['dashboard_url']}")


def up_cmd(
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    name: NameOpt = None,
    backend: BackendOption = Backend.kubernetes,
    timeout: TimeoutOpt = 300.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create a Ray cluster and wait until every GPU worker has joined Ray.

    --backend local starts a REAL Ray cluster on this machine (a 0-GPU head plus N worker raylets that
    advertise fake GPUs, all on loopback) to rehearse splits before GPU hours are spent; 'down' stops
    exactly the processes it started. Running 'up' again on a live cluster changes nothing.

    Examples:

      miles-ray up --backend local --nodes 4

      miles-ray up --nodes 4 --image radixark/miles:latest@sha256:<64 hex> --ray-version 2.60.0
    """
    from miles_ray.core.config import load_config
    from miles_ray.services import clusters

    cfg = load_config(config_flags(nodes=nodes, gpus_per_node=gpus_per_node, name=name), config)
    with progress_display(f"starting {backend.value} cluster {cfg.name}", quiet=output is not Output.table) as p:
        status = clusters.up(cfg, backend.value, progress=p, timeout=timeout)
    if status.get("already_running"):
        err.print(f"cluster {cfg.name!r} is already running; nothing changed (use 'miles-ray scale' to resize)")
    emit(status, output, lambda: nodes_table(status))
