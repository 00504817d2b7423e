"""miles-ray clusters: the clusters this machine knows, and which one is current."""

from __future__ import annotations

from typing import Annotated

import typer
from miles_ray.cli.common import Output, OutputOpt, emit, out
from miles_ray.services.known_clusters import ClusterList, list_clusters


def clusters_table(result: ClusterList) -> None:
    """One line per cluster, columns padded to their widest cell: nothing is ever cut (a long line wraps)."""
    if not result.clusters:
        out.print("no cluster on this machine yet: 'miles-ray up --backend local --name NAME' starts one")
        return
    rows = [("", "NAME", "BACKEND", "NAMESPACE", "CONTEXT", "STATE")]
    for c in result.clusters:
        state = c.state if c.checked != "record" or c.state == "down" else f"{c.state} (recorded)"
        rows.append(("*" if c.current else "", c.name, c.backend, c.namespace or "-", c.context or "-", state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip(), markup=False, soft_wrap=True)


def clusters_cmd(
    live: Annotated[bool, typer.Option("--live", help="ask each cluster for its state (Kubernetes: the API server) instead of reading what this machine recorded")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """List the clusters this machine knows (local and the Kubernetes ones 'up' made); * marks the current one.

    The current cluster is the one 'up' made last: every cluster verb uses it when no --name, MILES_RAY_NAME
    or config file name says otherwise; 'down' of it clears it. Local clusters come from their state files;
    Kubernetes clusters from what 'up', 'park' and 'down' recorded, without contacting the cluster unless
    --live.
    """
    result = list_clusters(live=live)
    emit(result, output, lambda: clusters_table(result))
