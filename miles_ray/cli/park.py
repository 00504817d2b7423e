"""miles-ray park: free a cluster's GPUs and keep what 'resume' needs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (Backend, BackendOption, ConfigOpt, ContextOpt, KubeconfigOpt, NameOpt, NamespaceOpt,
                                  Output, OutputOpt, TimeoutOpt, YesOpt, config_flags, confirm, emit, err,
                                  progress_display, warn)
from miles_ray.core.config import load_config
from miles_ray.core.durations import parse_duration
from miles_ray.services import lifecycle


def park_cmd(
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    if_idle_for: Annotated[Optional[str], typer.Option("--if-idle-for", metavar="DURATION", help="park only if no job has run and Ray saw no activity for this long (90s, 30m, 2h, 1d); otherwise say why and exit 0 -- for cron or CI", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="park even under a pending or running job (it ends with the pods)")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="kubernetes: return once the pods are gone")] = True,
    yes: YesOpt = False,
    timeout: TimeoutOpt = 300.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Park the cluster: its pods go (GPUs freed), the RayCluster object, claims and checkpoints stay.

    KubeRay: sets spec.suspend (refused when Kueue admits the cluster: Kueue owns suspend there; use 'down').
    Polyaxon: stops the run and keeps its operation. Local backend: stops the processes and keeps the shape.
    Refuses under a pending or running job unless --force. The runs' driver logs are saved first. 'resume'
    brings it back. Asks for confirmation unless --yes or --if-idle-for.
    """
    cfg = load_config(config_flags(name=name, namespace=namespace, kube_context=context, kubeconfig=kubeconfig), config)
    idle_for = parse_duration(if_idle_for, "--if-idle-for") if if_idle_for is not None else None
    chosen = lifecycle.pick_backend(backend.value, cfg)
    if not yes and idle_for is None and chosen != "local":
        confirm(f"park cluster {cfg.name!r} in namespace {cfg.namespace} (its pods are deleted; storage is kept)?",
                refusal=f"refusing to park cluster {cfg.name!r} without confirmation")
    with progress_display(f"parking cluster {cfg.name} ({chosen})", timeout=timeout if wait else None) as p:
        result = lifecycle.park(cfg, chosen, force=force, if_idle_for=idle_for, wait=wait, timeout=timeout, progress=p)
    def table() -> None:
        if not result["parked"]:
            err.print(f"cluster {cfg.name!r} {result['reason']}")
        elif result.get("already_parked"):
            err.print(f"cluster {cfg.name!r} was already parked")
        else:
            err.print(f"cluster {cfg.name!r} is parked; 'miles-ray resume' brings it back")

    emit(result, output, table)
    for run, why in ((result.get("saved_runs") or {}).get("not_saved") or {}).items():
        warn(f"could not save the logs of run {run}: {why}")
