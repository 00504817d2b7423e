"""miles-ray up: create a cluster (embedded local Ray, or KubeRay through Polyaxon) and wait until every
GPU worker has joined Ray."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer
from rich.table import Table

from miles_ray.cli.common import (AllowUnpinnedOpt, Backend, BackendOption, ConfigOpt, ContextOpt, GpusOpt, ImageOpt,
                                  KubeconfigOpt, LayoutOpt, NameOpt, NamespaceOpt, NodesOpt, Output, OutputOpt,
                                  QueueOpt, RayAuthOpt, RayVersionOpt, RecipeFileOpt, RecipeOpt, RolloutGpusOpt,
                                  RolloutNodesOpt, SchedulerOpt, TimeoutOpt, config_flags, emit, err, notices, out,
                                  progress_display, warn)
from miles_ray.core.errors import ConfigError
from miles_ray.cli.render import build_single_node_document
from miles_ray.core.builders import NO_AUTH_WARNING
from miles_ray.core.config import load_config
from miles_ray.services import clusters
from miles_ray.services.k8s_clusters import up_single_node


class Via(str, Enum):
    polyaxon = "polyaxon"
    kuberay = "kuberay"


class DryRun(str, Enum):
    client = "client"
    server = "server"


def nodes_table(status: dict) -> None:
    t = Table("node", "role", "state", "GPUs", "CPUs", "address", title=f"cluster {status['name']} ({status['backend']})",
              title_justify="left")
    for n in status.get("nodes", []):
        t.add_row(str(n.get("index", "")), "head" if n.get("is_head") else "gpu worker", n.get("state", ""),
                  f"{n.get('gpus', 0):g}", f"{n['cpus']:g}" if isinstance(n.get("cpus"), (int, float)) else "",
                  n.get("node_ip", ""))
    out.print(t)
    out.print(f"{status['gpu_node_count']} GPU worker(s), {status['total_gpus']:g} GPUs, dashboard / Jobs API "
              f"{status['dashboard_url']}")


def kube_summary(result: dict) -> None:
    if result.get("dry_run") and result.get("kubernetes") is False:
        out.print(f"dry run ({result['dry_run']}): operation validated and Polyaxon project checked for "
                  f"{result['name']}; Kubernetes preflight skipped (no kubeconfig); nothing created")
        return
    if result.get("dry_run"):
        out.print(f"dry run ({result['dry_run']}): preflight passed for {result['name']} in {result['namespace']} "
                  f"(KubeRay CRD {', '.join(result['preflight'].get('crd_versions', []))}; "
                  f"{result['preflight'].get('gpu_nodes_fitting', '?')} GPU node(s) fit); nothing created")
        return
    what = "created" if result.get("created") else "already existed"
    extra = f" (Polyaxon run {result['polyaxon_uuid']})" if result.get("polyaxon_uuid") else ""
    out.print(f"cluster {result['name']} {what} in {result['namespace']} via {result['via']}{extra}")
    if result.get("status"):
        kube_status_table(result["status"])


def polyaxon_status_table(st: dict) -> None:
    """A Polyaxon-made cluster seen through Polyaxon only (no kubeconfig): the run and its conditions."""
    t = Table("condition", "status", "reason", "message", title=f"Polyaxon run {st['polyaxon_uuid']} "
              f"({st['polyaxon_project']}), RayCluster {st['namespace']}/{st['raycluster']}", title_justify="left")
    for c in st.get("polyaxon_conditions") or []:
        t.add_row(c.get("type") or "", c.get("status") or "", c.get("reason") or "", (c.get("message") or "")[:100])
    out.print(t)
    out.print(f"cluster {st['name']}: Polyaxon run {st['polyaxon_status']}")


def down_line(st: dict) -> str:
    """A cluster 'down' took away: its Polyaxon run as Polyaxon sees it now."""
    run = (f"Polyaxon run {st['polyaxon_uuid']} ({st['polyaxon_project']}) "
           + (f"is {st['polyaxon_status']}" + (", being deleted" if st.get("polyaxon_deleting") else "")
              if st.get("polyaxon_status") else "is deleted (Polyaxon no longer has it)"))
    return (f"cluster {st['name']}: down since {st.get('down_at') or '?'} ('miles-ray down' stopped and deleted its "
            f"{run}); 'miles-ray up' creates it again")


def kube_status_table(st: dict) -> None:
    if st.get("down"):
        out.print(down_line(st))
        return
    if st.get("kubernetes") is False:
        polyaxon_status_table(st)
        return
    t = Table("pod", "role", "phase", "node", "reason", title=f"RayCluster {st['namespace']}/{st['raycluster']}",
              title_justify="left")
    for p in st["pods"]:
        t.add_row(p["name"], p["role"], p["phase"] + (" ready" if p["ready"] else ""), p["node"] or "-",
                  (p["reason"] + (": " + p["message"][:80] if p["message"] else "")) or "")
    out.print(t)
    line = (f"workers ready {st['ready_workers']}/{st['desired_workers']}, GPUs {st['ready_gpus']} "
            f"(desired {st['desired_gpus']}), state {st.get('state')}")
    if st.get("ray_nodes_alive") is not None:
        line += f", Ray nodes alive {st['ray_nodes_alive']} ({st.get('ray_gpus')} GPUs)"
    if st.get("polyaxon_uuid"):
        line += f", Polyaxon run {st['polyaxon_uuid']} {st.get('polyaxon_status')}"
    out.print(line)


def up_cmd(
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
    name: NameOpt = None,
    backend: BackendOption = Backend.auto,
    via: Annotated[Via, typer.Option("--via", help="kubernetes: create a Polyaxon raycluster operation, or the KubeRay RayCluster directly")] = Via.polyaxon,
    dry_run: Annotated[Optional[DryRun], typer.Option("--dry-run", help="client: preflight only; server: also the API server's dry run of the create", show_default=False)] = None,
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
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    recipe_file: RecipeFileOpt = None,
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
    --name when one already runs on this machine (then nothing changes), else Kubernetes. Running 'up'
    again on a live cluster changes nothing. Progress goes to stderr whatever -o is.

    Ray token authentication is on by default (--ray-auth token): locally a fresh token per cluster in a 0600
    file beside its state; on Kubernetes KubeRay's authOptions (KubeRay >= 1.6) with the token in a Secret, and
    by Secret reference on the Polyaxon path. Every miles-ray verb sends the token itself.

    Examples:

    \b
      miles-ray up --backend local --nodes 4
      miles-ray up --nodes 4 --image radixark/miles:latest@sha256:<64 hex> --ray-version 2.60.0
      miles-ray up --single-node --image radixark/miles:latest@sha256:<64 hex>
    """
    cfg = load_config(config_flags(nodes=nodes, gpus_per_node=gpus_per_node, name=name, recipe=recipe, layout=layout,
                                   rollout_nodes=rollout_nodes, rollout_gpus=rollout_gpus, image=image,
                                   ray_version=ray_version, allow_unpinned=allow_unpinned, namespace=namespace,
                                   kube_context=context, kubeconfig=kubeconfig, recipe_file=recipe_file,
                                   queue=queue, scheduler=scheduler, ray_auth=ray_auth), config)
    if cfg.ray_auth == "none":
        warn(NO_AUTH_WARNING)
    if single_node:
        if backend is Backend.local or via is Via.kuberay:
            raise ConfigError("--single-node creates a Polyaxon job (the launcher starts Ray inside its pod)",
                              hint="drop --backend local / --via kuberay with --single-node")
        with progress_display(f"creating single-node job {cfg.name}", timeout=timeout if wait else None) as p:
            op, warnings = build_single_node_document(cfg)
            result = up_single_node(cfg, op, warnings, dry_run.value if dry_run else None, wait, timeout, p)
        for w in result.get("warnings", []):
            warn(w)
        notices(result)
        emit(result, output, lambda: out.print(
            f"single-node job {cfg.name} " + ("validated (dry run, nothing created)" if result.get("dry_run") else
                                               f"created: Polyaxon run {result['polyaxon_uuid']} [{result['status']}]")
            + f" in {cfg.polyaxon_owner}/{cfg.polyaxon_project}"))
        return
    chosen = clusters.pick_backend(backend.value, cfg)
    kube = {}
    if chosen == "local":
        if dry_run:
            raise ConfigError("--dry-run applies to --backend kubernetes", hint="'miles-ray plan' checks a split")
    else:
        kube = {"via": via.value, "dry_run": dry_run.value if dry_run else None, "wait": wait, "ray_check": ray_check}
    bounded = chosen == "local" or (wait and not dry_run)
    with progress_display(f"starting {chosen} cluster {cfg.name}", timeout=timeout if bounded else None) as p:
        status = clusters.up(cfg, chosen, progress=p, timeout=timeout, **kube)
    if status.get("already_running"):
        err.print(f"cluster {cfg.name!r} is already running; nothing changed (use 'miles-ray scale' to resize)")
    for w in status.get("warnings", []):
        warn(w)
    notices(status)
    if chosen == "local":
        emit(status, output, lambda: nodes_table(status))
    else:
        emit(status, output, lambda: kube_summary(status))
