"""miles-ray up: create a cluster (embedded local Ray, or KubeRay through Polyaxon) and wait until every
GPU worker has joined Ray."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from miles_ray.cli.common import (AllowUnpinnedOpt, Backend, ConfigOpt, GcsFtOpt, GcsFtPasswordOpt, GpusOpt, ImageOpt, LayoutOpt, NodesOpt, Output,
                                  OutputOpt, QueueOpt, RayAuthOpt, RayVersionOpt, RecipeFileOpt, RecipeOpt,
                                  NoMemoryCheckOpt, RolloutGpusOpt, RolloutNodesOpt, SchedulerOpt, TimeoutOpt, emit, err, notices, out,
                                  progress_display, warn)
from miles_ray.cli.options import ClusterFlags, cluster_options
from miles_ray.core.errors import ConfigError
from miles_ray.cli.views import cluster_table, ray_tools_hint
from miles_ray.core.builders import NO_AUTH_WARNING
from miles_ray.core.prepare import check_inputs, check_pods_fit
from miles_ray.services import clusters
from miles_ray.services.backends.results import KubeUp, LocalUp
from miles_ray.services.single_node import up_single_node


class Via(str, Enum):
    polyaxon = "polyaxon"
    kuberay = "kuberay"


class DryRun(str, Enum):
    client = "client"
    server = "server"


@cluster_options
def up_cmd(
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    cluster: ClusterFlags = ClusterFlags(),
    via: Annotated[Via, typer.Option("--via", help="kubernetes: create a Polyaxon raycluster operation, or the KubeRay RayCluster directly")] = Via.polyaxon,
    dry_run: Annotated[Optional[DryRun], typer.Option("--dry-run", help="client: render and validate what would be created, contacting nothing (like kubectl --dry-run=client); server: also the live checks (preflight) and the API server's dry run of the create", show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until every GPU worker has joined Ray")] = True,
    ray_check: Annotated[bool, typer.Option("--ray-check/--no-ray-check", help="after the pods are ready, confirm in Ray (dashboard via port-forward) that the GPU workers joined")] = True,
    recipe: RecipeOpt = None,
    layout: LayoutOpt = None,
    rollout_nodes: RolloutNodesOpt = None,
    rollout_gpus: RolloutGpusOpt = None,
    image: ImageOpt = None,
    ray_version: RayVersionOpt = None,
    allow_unpinned: AllowUnpinnedOpt = None,
    queue: QueueOpt = None,
    scheduler: SchedulerOpt = None,
    ray_auth: RayAuthOpt = None,
    gcs_ft: GcsFtOpt = None,
    gcs_ft_password_secret: GcsFtPasswordOpt = None,
    recipe_file: RecipeFileOpt = None,
    no_memory_check: NoMemoryCheckOpt = False,
    timeout: TimeoutOpt = 600.0,
    config: ConfigOpt = None,
    output: OutputOpt = Output.table,
    single_node: Annotated[bool, typer.Option("--single-node", help="start with one single-node job: create ONE Polyaxon job running the upstream Miles launcher in one pod (see 'render --single-node'); --wait waits until it runs")] = False,
) -> None:
    """Create a Ray cluster and wait until every GPU worker has joined Ray.

    --backend local starts a REAL Ray cluster on this machine (a 0-GPU head plus N worker raylets that
    advertise fake GPUs, all on loopback) to rehearse splits before GPU hours are spent; 'down' stops
    exactly the processes it started. --backend kubernetes creates a KubeRay cluster, through Polyaxon
    (--via polyaxon) or directly (--via kuberay). The default, --backend auto, is the local cluster of that
    --name when one already runs on this machine, else Kubernetes. Running 'up' again with the same request
    changes nothing; another size or image is refused (exit 2) naming what differs and the fix ('scale
    --nodes N', or 'down' then 'up'). Progress goes to stderr whatever -o is.

    Ray token authentication is on by default (--ray-auth token): locally a fresh token per cluster in a 0600
    file beside its state; on Kubernetes KubeRay's authOptions (KubeRay >= 1.6) with the token in a Secret, and
    by Secret reference on the Polyaxon path. Every miles-ray verb sends the token itself.

    --gcs-ft redis://HOST:PORT (with --gcs-ft-password-secret NAME[:KEY]) keeps Ray's GCS state in that Redis:
    when the head pod is lost, KubeRay starts a new one and the workers' raylets reconnect to it instead of
    restarting, and jobs whose driver runs on a worker keep running. --via kuberay only (Polyaxon 2.18's
    raycluster cannot carry it); before creating anything, up checks the Secret and runs a short-lived pod in
    the namespace that must get PONG from the Redis.

    Examples:

    \b
      miles-ray up --backend local --nodes 4
      miles-ray up --nodes 4 --image radixark/miles:latest@sha256:<64 hex> --ray-version 2.60.0
      miles-ray up --single-node --image radixark/miles:latest@sha256:<64 hex>
      miles-ray up --via kuberay --nodes 4 --gcs-ft redis://redis.infra.svc.cluster.local:6379 --gcs-ft-password-secret redis-auth
    """
    cfg = cluster.config(config, nodes=nodes, gpus_per_node=gpus_per_node, recipe=recipe, layout=layout,
                         rollout_nodes=rollout_nodes, rollout_gpus=rollout_gpus, image=image, ray_version=ray_version,
                         allow_unpinned=allow_unpinned, recipe_file=recipe_file, queue=queue, scheduler=scheduler,
                         ray_auth=ray_auth, gcs_ft=gcs_ft, gcs_ft_password_secret=gcs_ft_password_secret)
    backend = cluster.backend
    if cfg.ray_auth == "none":
        warn(NO_AUTH_WARNING)
    if single_node:
        if backend is Backend.local or via is Via.kuberay:
            raise ConfigError("--single-node creates a Polyaxon job (the launcher starts Ray inside its pod)",
                              hint="drop --backend local / --via kuberay with --single-node")
        check_inputs(cfg, single_node=True)  # bad input fails here, before any progress line
        with progress_display(f"creating single-node job {cfg.name}", timeout=timeout if wait else None) as p:
            result = up_single_node(cfg, dry_run.value if dry_run else None, wait, timeout, p)
        for w in result.warnings:
            warn(w)
        notices(result.to_json())
        emit(result, output, lambda: out.print(
            f"single-node job {cfg.name} " + ("validated (dry run, nothing created)" if result.dry_run else
                                               f"created: Polyaxon run {result.polyaxon_uuid} [{result.status}]")
            + f" in {cfg.polyaxon_owner}/{cfg.polyaxon_project}"))
        return
    chosen = clusters.up_backend(cfg, backend.value, via.value, dry_run.value if dry_run else None)
    if cfg.gcs_ft and chosen.on_this_machine:
        raise ConfigError("--gcs-ft is for a KubeRay cluster: the local cluster's head and workers are processes "
                          "of this machine", hint="drop --gcs-ft with --backend local")
    bounded = chosen.on_this_machine or (wait and not dry_run)
    if not chosen.on_this_machine:
        check_inputs(cfg)  # bad input (image, Ray version, split) fails here, before any progress line
        for notice in check_pods_fit(cfg, no_memory_check):  # a named recipe's host memory vs memory_per_node
            warn(notice)
    with progress_display(f"starting {chosen.name} cluster {cfg.name}", timeout=timeout if bounded else None) as p:
        result = clusters.up(cfg, chosen, progress=p, timeout=timeout, dry_run=dry_run.value if dry_run else None,
                             wait=wait, ray_check=ray_check)
    if isinstance(result, LocalUp) and result.already_running:
        err.print(f"cluster {cfg.name!r} is already running; nothing changed (use 'miles-ray scale' to resize)")
    for w in result.warnings if isinstance(result, KubeUp) else []:
        warn(w)
    notices(result.to_json())
    emit(result, output, lambda: cluster_table(result))
    if not dry_run:
        ray_tools_hint(cfg.name, output)
