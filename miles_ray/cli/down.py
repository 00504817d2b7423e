"""miles-ray down: delete the cluster (never its storage or checkpoints)."""

from __future__ import annotations

from miles_ray.cli.common import (ConfigOpt, Output, OutputOpt, YesOpt, confirm, emit, err, notices, progress_display,
                                  warn)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.cli.views import down_line
from miles_ray.services import clusters
from miles_ray.services.backends.results import DownCluster


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
    chosen = clusters.backend_for(cfg, cluster.backend.value)
    if not chosen.on_this_machine and not yes:
        confirm(f"delete cluster {cfg.name!r} in namespace {cfg.namespace}? storage is kept",
                refusal=f"refusing to delete cluster {cfg.name!r} without confirmation")
    with progress_display(f"deleting cluster {cfg.name} ({chosen.name}); storage and checkpoints are kept"):
        result = clusters.down(cfg, chosen)
    notices(result.to_json())
    if isinstance(result, DownCluster):  # taken down before: Polyaxon's view of its run
        emit(result, output, lambda: err.print(down_line(result) + "; nothing to do"))
        return
    if result.already_down:  # nothing to take down: what 'down' wants, so exit 0 ('trap "down -y" EXIT' clean-ups)
        emit(result, output, lambda: err.print(f"cluster {cfg.name!r} was already down ({chosen.name}); nothing to do"))
        return
    emit(result, output, lambda: err.print(f"cluster {cfg.name!r} is down ({chosen.name}); storage and checkpoints kept"))
    saved = result.saved_runs
    if output is Output.table and saved is not None and saved.saved:
        err.print(f"saved the logs and job info of run(s) {', '.join(saved.saved)} ('miles-ray logs RUN' reads them)")
    for run, why in (saved.not_saved if saved is not None else {}).items():
        warn(f"could not save the logs of run {run}: {why}")
    for run, why in (saved.outputs_not_saved if saved is not None else {}).items():
        warn(f"could not keep the checkpoint listing of run {run} ('runs outputs'): {why}")
