"""miles-ray comm-check: before training, prove that every GPU node can reach the others (an all-reduce)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Col, ConfigOpt, Output, OutputOpt, checks_failed, emit, fit_table, out, print_table,
                                  progress_display)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.core.probes import comm_check_bound
from miles_ray.services.comm_check import comm_check


def _rate(v) -> str:
    if not v:
        return "-"
    return f"{v / 1e9:.2f} GB/s" if v >= 1e9 else f"{v / 1e6:.1f} MB/s"


@cluster_options
def comm_check_cmd(
    address: Annotated[Optional[str], typer.Option("--address", help="the Ray head: dashboard / Jobs API URL, k8s://NAMESPACE/RAYCLUSTER (a port-forward) or local://NAME [default: $RAY_ADDRESS, config, or the cluster made by up]", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    size_mb: Annotated[float, typer.Option("--size-mb", help="all-reduce payload per node, MiB")] = 16.0,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="bound on placement, actor start and the ring, seconds each")] = 60.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Run one all-reduce across all GPU worker nodes as a Ray job, before training.

    One actor per GPU node (one {GPU: 1, CPU: 1} bundle per node, STRICT_SPREAD, bounded wait) reports its
    node IP and the network interface owning it; then they all-reduce --size-mb: NCCL where torch has CUDA
    (the Miles image), gloo where torch has no GPU, else a plain-TCP ring (reported as
    'tcp (torch not installed)'). Prints pass/fail and ring bytes/second per node, and names any node that
    could not be reached. Exit 0 when every node passed, 4 otherwise.

    Examples:

      miles-ray comm-check --name miles

      miles-ray comm-check --address http://HEAD:8265 --size-mb 256 -o json
    """
    cfg = cluster.config(config)
    with progress_display("comm check", timeout=comm_check_bound(timeout)) as p:
        result = comm_check(cfg, address=address, backend=cluster.backend.value, size_mb=size_mb, timeout=timeout,
                            progress=p)

    def table() -> None:
        rows = [[n.ip or "?", (n.node_id or "?")[:12], f"{n.interface or '?'} ({n.address or '-'})" if n.interface else "?",
                 "[green]PASS[/]" if n.ok else f"[red]FAIL[/] ({n.status})", _rate(n.bytes_per_s), n.error or n.note or ""]
                for n in result.nodes]
        print_table(fit_table([Col("node", key=True), Col("id", keep=2), Col("interface", keep=3), Col("result", keep=6),
                               Col("ring bytes/s", keep=4), Col("reason", keep=5)], rows))
        size = result.size_bytes / 2**20
        out.print(f"backend {result.backend or '?'}, {size:g} MiB all-reduce over "
                  f"{sum(1 for n in result.nodes if n.rank is not None)} of "
                  f"{result.gpu_nodes} GPU node(s); slowest node {_rate(result.min_bytes_per_s)}")
        for e in result.errors:
            out.print(f"[red]{e}[/]")
        out.print("[green]comm check passed[/]" if result.ok else "[red]comm check FAILED[/]")

    emit(result, output, table)
    if not result.ok:
        checks_failed("comm-check", max(1, len(result.errors)))
