"""miles-ray down: delete the cluster (never its storage or checkpoints)."""

from __future__ import annotations

from miles_ray.cli.common import (ConfigOpt, Output, OutputOpt, YesOpt, confirm, emit, err, notices, progress_display,
                                  warn)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import down_line
from miles_ray.services import clusters


@cluster_options
def down_cmd(
    cluster: ClusterFlags,
    yes: YesOpt = False,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Delete the cluster. Shared storage, PVCs and checkpoints are never touched.

    First saves the driver logs and job info of every run recorded on the cluster next to its run record, so
    'logs RUN' and 'status RUN' still answer afterwards. Asks for confirmation unless --yes (the local
    backend, which only stops local processes, does not ask).
    """

    cfg = cluster.config(config)
    chosen = clusters.pick_backend(cluster.backend.value, cfg)
    if chosen != "local" and not yes:
        confirm(f"delete cluster {cfg.name!r} in namespace {cfg.namespace}? storage is kept",
                refusal=f"refusing to delete cluster {cfg.name!r} without confirmation")
    with progress_display(f"deleting cluster {cfg.name} ({chosen}); storage and checkpoints are kept"):
        result = clusters.down(cfg, chosen)
    notices(result)
    if result.get("already_down"):
        emit(result, output, lambda: err.print(down_line(result) + "; nothing to do"))
        return
    emit(result, output, lambda: err.print(f"cluster {cfg.name!r} is down ({chosen}); storage and checkpoints kept"))
    saved = result.get("saved_runs") or {}
    if output is Output.table and saved.get("saved"):
        err.print(f"saved the logs and job info of run(s) {', '.join(saved['saved'])} ('miles-ray logs RUN' reads them)")
    for run, why in (saved.get("not_saved") or {}).items():
        warn(f"could not save the logs of run {run}: {why}")
