"""miles-ray doctor: the troubleshooting checklist, automated (evidence and a fix for each finding)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (ConfigOpt, Output, OutputOpt, RecipeFileOpt, checks_failed, emit, out,
                                  progress_display)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.core.errors import ConfigError
from miles_ray.core.probes import check_data_bound
from miles_ray.services.doctor import DoctorReport, check_target, doctor

MARK = {"problem": "[red]✗[/]", "warning": "[yellow]![/]", "ok": "[green]✓[/]", "skipped": "[dim]-[/]"}


def findings_table(rep: DoctorReport) -> None:
    out.print(f"doctor {rep.kind} {rep.target} (cluster {rep.cluster}, {rep.backend})")
    for f in rep.findings:
        out.print(f"{MARK.get(f.status, '?')} [bold]{f.check}[/] [dim]({f.checklist})[/]: {f.summary}")
        if f.status in ("problem", "warning", "skipped"):
            for e in f.evidence:
                out.print(f"    [dim]·[/] {e}")
            if f.fix:
                out.print(f"    [bold]fix:[/] {f.fix}")
    out.print(f"{rep.problems} problem(s), {rep.warnings} warning(s)")


@cluster_options
def doctor_cmd(
    target: Annotated[Optional[str], typer.Argument(metavar="CLUSTER|RUN", help="a cluster name or a run name (default: the configured cluster); a cluster is also named by --name, like on every other verb", show_default=False)] = None,
    cluster: ClusterFlags = ClusterFlags(),
    address: Annotated[Optional[str], typer.Option("--address", help="Ray dashboard URL of a reachable head (e.g. a port-forward): adds the data, checkpoint and Ray-version checks", show_default=False)] = None,
    recipe_file: RecipeFileOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="bound on each per-node round of the data checks (s)")] = 60.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Diagnose a cluster or a run against the troubleshooting checklist.

    Pods Pending (can one node supply all their GPUs? taints, selectors, quotas), Ray/NCCL start-up (waiting
    reasons, /dev/shm, nvidia.com/gpu vs num-gpus, MILES_SCRIPT_EXTERNAL_RAY and the head address, every Ready
    pod a node of Ray), missing
    model/data/checkpoints (check-data's checks, where a head is reachable), restarts from scratch (the run's
    output dir and checkpoint tracker), image and Ray version drift between the spec and the running pods.
    Exit 0 when nothing is wrong, 4 when a problem was found. docs/troubleshooting.md lists every check.

    Examples:

    \b
      miles-ray doctor --name miles --namespace ml
      miles-ray doctor q4-b --address http://127.0.0.1:8265
    """
    name = cluster.name
    if name is not None and target is not None and name != target:
        raise ConfigError(f"doctor was given two targets: {target!r} and --name {name!r}",
                          hint="give one: --name CLUSTER, or CLUSTER|RUN")
    if name is not None:
        target = None  # --name names the cluster (cfg.name), never a run
    cfg = cluster.config(config, recipe_file=recipe_file)
    check_target(cfg, target)  # bad input before any progress line
    # time left: the data checks' whole bound, plus a minute for the Kubernetes and Ray reads around them
    with progress_display(f"diagnosing {target or cfg.name}", timeout=check_data_bound(timeout) + 60) as p:
        rep = doctor(cfg, target, cluster.backend.value, address, timeout=timeout, progress=p)
    emit(rep, output, lambda: findings_table(rep))
    checks_failed("doctor", rep.problems)
