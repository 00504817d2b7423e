"""Tables and lines that more than one verb prints (a verb module never imports another verb module: what two
verbs show alike lives here), and the views of the cluster verbs' typed results, each chosen by the result's type."""

from __future__ import annotations

import sys

from miles_ray.cli.common import Col, Output, err, fit_table, out, print_table
from miles_ray.core.runs import RunStatus, SavedCopySource
from miles_ray.core.supervision import resumed_at
from miles_ray.services import runs
from miles_ray.services.backends.results import (DownCluster, KubeResume, KubeScale, KubeStatus, KubeUp, LocalCluster,
                                                 ParkedCluster, ParkResult, PolyaxonRunStatus)


# -- clusters (up, status, scale, resume, down): the view is chosen by the result's type --

def nodes_table(status: LocalCluster) -> None:
    """A local cluster: its Ray nodes."""
    rows = [[str(n.get("index", "")), "head" if n.get("is_head") else "gpu worker", n.get("state", ""),
             f"{n.get('gpus', 0):g}", f"{n['cpus']:g}" if isinstance(n.get("cpus"), (int, float)) else "",
             n.get("node_ip", "")] for n in status.nodes]
    print_table(fit_table([Col("node", key=True), Col("role", keep=5), Col("state", keep=6), Col("GPUs", keep=4),
                           Col("CPUs", keep=2), Col("address", keep=3)], rows,
                          title=f"cluster {status.name} ({status.backend})", title_justify="left"))
    out.print(f"{status.gpu_node_count} GPU worker(s), {status.total_gpus:g} GPUs, dashboard / Jobs API "
              f"{status.dashboard_url}")


def kube_summary(result: KubeUp) -> None:
    """'up' on Kubernetes: what the preflight found, what was created, and the cluster once ready."""
    if result.dry_run and not result.kubernetes:
        out.print(f"dry run ({result.dry_run}): operation validated and Polyaxon project checked for "
                  f"{result.name}; Kubernetes preflight skipped (no kubeconfig); nothing created")
        return
    if result.dry_run:
        out.print(f"dry run ({result.dry_run}): preflight passed for {result.name} in {result.namespace} "
                  f"(KubeRay CRD {', '.join(result.preflight.crd_versions)}; "
                  f"{'?' if result.preflight.gpu_nodes_fitting is None else result.preflight.gpu_nodes_fitting} GPU "
                  "node(s) fit); nothing created")
        return
    what = "created" if result.created else "already existed"
    extra = f" (Polyaxon run {result.polyaxon_uuid})" if result.polyaxon_uuid else ""
    out.print(f"cluster {result.name} {what} in {result.namespace} via {result.via}{extra}")
    if result.status is not None:
        kube_status_table(result.status)


def polyaxon_status_table(st: PolyaxonRunStatus) -> None:
    """A Polyaxon-made cluster seen through Polyaxon only (no kubeconfig): the run and its conditions."""
    rows = [[c.get("type") or "", c.get("status") or "", c.get("reason") or "", (c.get("message") or "")[:100]]
            for c in st.polyaxon_conditions]
    print_table(fit_table([Col("condition", key=True), Col("status", keep=3), Col("reason", keep=2),
                           Col("message", keep=1)], rows,
                          title=f"Polyaxon run {st.polyaxon_uuid} ({st.polyaxon_project}), RayCluster "
                                f"{st.namespace}/{st.raycluster}", title_justify="left"))
    out.print(f"cluster {st.name}: Polyaxon run {st.polyaxon_status}")


def down_line(st: DownCluster) -> str:
    """A cluster 'down' took away: its Polyaxon run as Polyaxon sees it now."""
    run = (f"Polyaxon run {st.polyaxon_uuid} ({st.polyaxon_project}) "
           + (f"is {st.polyaxon_status}" + (", being deleted" if st.polyaxon_deleting else "")
              if st.polyaxon_status else "is deleted (Polyaxon no longer has it)"))
    return (f"cluster {st.name}: down since {st.down_at or '?'} ('miles-ray down' stopped and deleted its "
            f"{run}); 'miles-ray up' creates it again")


def parked_line(st: ParkedCluster) -> None:
    out.print(f"cluster {st.name}: [bold]parked[/] since {st.parked_at}; 'miles-ray resume' brings it back")


def kube_status_table(st: KubeStatus | KubeScale | PolyaxonRunStatus | DownCluster) -> None:
    """A cluster on Kubernetes: its pods and workers (or, taken down or without a kubeconfig, its Polyaxon run)."""
    if isinstance(st, DownCluster):
        out.print(down_line(st))
        return
    if isinstance(st, PolyaxonRunStatus):
        polyaxon_status_table(st)
        return
    rows = [[p["name"], p["role"], p["phase"] + (" ready" if p["ready"] else ""), p["node"] or "-",
             (p["reason"] + (": " + p["message"][:80] if p["message"] else "")) or ""] for p in st.pods]
    # the pod name (kubectl logs POD) is never cut; at narrow widths the reason, then the node go first
    print_table(fit_table([Col("pod", key=True), Col("role", keep=3), Col("phase", keep=4), Col("node", keep=2),
                           Col("reason", keep=1)], rows,
                          title=f"RayCluster {st.namespace}/{st.raycluster}", title_justify="left"))
    line = (f"workers ready {st.ready_workers}/{st.desired_workers}, GPUs {st.ready_gpus} "
            f"(desired {st.desired_gpus}), state {st.state}")
    if st.ray_nodes_alive is not None:
        line += f", Ray nodes alive {st.ray_nodes_alive} ({st.ray_gpus} GPUs)"
    if st.polyaxon_uuid:
        line += f", Polyaxon run {st.polyaxon_uuid} {st.polyaxon_status}"
    out.print(line)


def cluster_table(result: object) -> None:
    """The cluster a verb left (up, status, scale, resume), by its type: a local cluster's nodes, a Kubernetes
    one's pods, a parked one's line."""
    if isinstance(result, LocalCluster):
        nodes_table(result)
    elif isinstance(result, KubeUp):
        kube_summary(result)
    elif isinstance(result, ParkedCluster):
        parked_line(result)
    elif isinstance(result, (KubeStatus, KubeScale, PolyaxonRunStatus, DownCluster)):
        kube_status_table(result)


def cluster_status(status: object) -> None:
    """'status' of a cluster: its table, then whether Kueue holds it, it is parked, or since when it is idle."""
    cluster_table(status)
    if isinstance(status, KubeStatus) and status.queue.get("queued"):
        out.print(f"queued: Kueue has not admitted it yet (LocalQueue {status.queue['queue']}): "
                  f"{status.queue['reason']}")
    elif isinstance(status, KubeStatus) and status.state == "suspended":
        out.print("parked (spec.suspend: true); 'miles-ray resume' brings it back")
    idle = getattr(status, "idle", None)
    if idle:
        out.print(f"idle since {idle.since} ({idle.idle_seconds:.0f}s): {idle.reason}" if idle.idle
                  else f"busy: {idle.reason}" if idle.idle is False else f"idle: unknown ({idle.reason})")


def scaled(result: LocalCluster | KubeScale) -> None:
    """'scale': the cluster at its new size (on Kubernetes without --wait: only that it was asked)."""
    if isinstance(result, KubeScale) and not result.waited:
        err.print(f"scaled {result.name} to {result.to}")
    else:
        cluster_table(result)


def park_line(result: ParkResult) -> None:
    """'park': parked now, already, or not (and why)."""
    if not result.parked:
        err.print(f"cluster {result.name!r} {result.reason}")
    elif result.already_parked:
        err.print(f"cluster {result.name!r} was already parked")
    else:
        err.print(f"cluster {result.name!r} is parked; 'miles-ray resume' brings it back")


def resumed(result: LocalCluster | KubeResume) -> None:
    """'resume': the cluster back (a local one's nodes; a Kubernetes one's pods, once waited for)."""
    if isinstance(result, KubeResume):
        if result.status is not None:
            cluster_table(result.status)
    else:
        cluster_table(result)
    err.print(f"cluster {result.name!r} " + ("resumed" if result.resumed else "was not parked"))


# -- runs --

def run_status_line(info: RunStatus) -> None:
    """status RUN as a table: the job's state, its message, and where a saved copy came from."""
    saved = info.saved_copy
    out.print(f"run {info.run}: [bold]{info.status}[/] (job {info.submission_id} on {info.address})"
              + (f"\n{info.message}" if info.message else "")
              + (f"\n(read the saved copy {saved.dir}, saved {saved.saved_at}: {saved.reason}; the cluster no longer "
                 "has the job)" if saved else ""))
    if info.polyaxon_uuid:
        out.print(f"Polyaxon run {info.polyaxon_uuid}" + (f" [{info.polyaxon_status}]" if info.polyaxon_status else ""),
                  markup=False)
    if info.supervisor is not None:
        sup = info.supervisor
        state = ("finished" if sup.finished else "running" if sup.alive else "not running" if sup.alive is False
                 else "unknown")
        out.print(f"supervised ({sup.kind}, up to {sup.max_restarts} restart(s)); its supervisor is {state}",
                  markup=False)
    if info.attempts:
        print_table(attempts_table(info))


def attempts_table(info: RunStatus):
    """A supervised run's attempts (status RUN, and its --watch view), a Rich Table."""
    rows = [[str(a.attempt), a.submission_id or "", a.status or "", a.started or "", a.ended or "",
             resumed_at(a.resumed_from, a.resumed_iteration), "" if a.last_step is None else str(a.last_step),
             a.reason or ""]
            for a in info.attempts or []]
    return fit_table([Col("attempt", key=True), Col("job", keep=7), Col("status", keep=8), Col("started", keep=4),
                      Col("ended", keep=3), Col("resumed from", keep=5), Col("last step", keep=6),
                      Col("reason", keep=2)], rows)


def read_logs(run: str, follow: bool, output: Output, kube_context: str | None = None,
              kubeconfig: str | None = None) -> tuple[str | None, str | None]:
    """(logs, state) of a run's job (logs RUN, submit --follow). As a table the logs stream to stdout as they come
    (and are not returned); for json/yaml they are returned whole. The state is read once the logs end, when
    following or for json/yaml; after following it is also said on stderr."""
    kube = {"kube_context": kube_context, "kubeconfig": kubeconfig}

    def saved_copy(where: SavedCopySource) -> None:
        err.print(f"run {run}: its cluster no longer has the job; reading the saved copy ({where.dir}, saved "
                  f"{where.saved_at}: {where.reason})")

    text = None
    if output is Output.table:
        for chunk in runs.run_logs(run, follow, on_saved_copy=saved_copy, **kube):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    else:
        text = "".join(runs.run_logs(run, follow, on_saved_copy=saved_copy, **kube))
    state = runs.run_status(run, **kube).status if follow or output is not Output.table else None
    if follow:
        err.print(f"run {run}: {state}")
    return text, state


def ray_tools_hint(name: str, output: Output) -> None:
    """After 'up' and 'status' (table output): one stderr line saying how Ray's own tools reach the cluster."""
    if output is Output.table:
        err.print(f"Ray's own tools (ray job list, ray status): eval \"$(miles-ray env {name})\"", soft_wrap=True,
                  markup=False)
