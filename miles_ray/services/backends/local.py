"""The local backend: a real Ray cluster on this machine (a 0-GPU head plus worker raylets that advertise fake
GPUs), started and stopped by :mod:`miles_ray.adapters.local_ray`; parking stops its processes and keeps its
shape for 'resume'."""

from __future__ import annotations

import time

from miles_ray.adapters import local_ray, state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.heads import LOCAL_SCHEME
from miles_ray.core.progress import Progress, say
from miles_ray.services import saved_runs
from miles_ray.services.backends.drift import refuse_drift
from miles_ray.services.backends.idle import idle_report, iso, park_gate
from miles_ray.services.backends.results import (IdleReport, LocalDown, LocalResume, LocalScale, LocalStatus, LocalUp,
                                                 ParkedCluster, ParkResult, SavedRuns)
from miles_ray.services.heads import local_exists
from miles_ray.services.runs import live_status
from miles_ray.services.runs.supervised import save_supervisor_events, stop_supervisors


def _status(cfg: MilesRayConfig) -> LocalStatus:
    return LocalStatus(**local_ray.status(state.local_clusters_dir(), cfg.name))


def _parked(cfg: MilesRayConfig) -> dict | None:
    """What 'park' kept of this cluster, while it is parked (its processes gone)."""
    return None if local_exists(cfg.name) else state.read_parked_local(cfg.name)


class LocalBackend:
    name = "local"
    on_this_machine = True  # only local processes: 'down' and 'park' do not ask; 'up' always waits

    def up(self, cfg: MilesRayConfig, *, progress: Progress = None, timeout: float = 300, dry_run: str | None = None,
           wait: bool = True, ray_check: bool = True) -> LocalUp:
        """Start the cluster and wait for every node (``dry_run``, ``wait``, ``ray_check`` are Kubernetes' only:
        :func:`miles_ray.services.clusters.up_backend` refuses a dry run here)."""
        # Local fake nodes advertise one CPU per GPU plus one spare (Miles's bundles are {GPU:1, CPU:1}).
        out = LocalUp(**local_ray.up(state.local_clusters_dir(), cfg.name, cfg.nodes, cfg.gpus_per_node,
                                     cfg.gpus_per_node + 1, progress=progress, timeout=timeout, auth=cfg.ray_auth))
        if out.already_running and not out.matches_request:  # the same request again changes nothing
            diffs, nodes_differ = [], out.gpu_node_count != cfg.nodes
            if nodes_differ:
                diffs.append(f"{out.gpu_node_count} GPU node(s) running, --nodes {cfg.nodes}")
            if out.gpus_per_node != cfg.gpus_per_node:
                diffs.append(f"{out.gpus_per_node} GPUs per node running, --gpus-per-node {cfg.gpus_per_node}")
            refuse_drift(f"local cluster {cfg.name!r}", diffs or ["its shape"], live_nodes=out.gpu_node_count,
                         live_gpus=out.gpus_per_node, scale_to=cfg.nodes if nodes_differ else None,
                         rest_differs=out.gpus_per_node != cfg.gpus_per_node)
        return out

    def status(self, cfg: MilesRayConfig, *, with_ray: bool = False) -> LocalStatus | ParkedCluster:
        """The running cluster and since when it is idle, or what 'park' kept of it."""
        parked = _parked(cfg)
        if parked is not None:
            return ParkedCluster(**{"name": cfg.name, "backend": self.name, "parked": True, **parked})
        st = _status(cfg)
        try:
            st.idle = idle_report(st.dashboard_url or "")
        except ClusterError as e:
            st.idle = IdleReport(idle=None, reason=str(e).splitlines()[0])
        return st

    def refuse_scale(self, cfg: MilesRayConfig) -> None:
        """Nothing owns a local cluster's size but 'scale'."""

    def scale(self, cfg: MilesRayConfig, nodes: int, *, progress: Progress = None, timeout: float = 300,
              force: bool = False, wait: bool = True, ray_check: bool = True) -> LocalScale:
        if not force:
            refuse_shrink_below_running_jobs(cfg, nodes, _status(cfg))
        return LocalScale(**local_ray.scale(state.local_clusters_dir(), cfg.name, nodes, progress=progress,
                                            timeout=timeout))

    def park(self, cfg: MilesRayConfig, *, force: bool = False, if_idle_for: float | None = None,
             wait: bool = True, timeout: float = 300, progress: Progress = None) -> ParkResult:
        """Stop the processes and keep the shape ('resume' starts the same nodes again)."""
        if state.read_parked_local(cfg.name) is not None and not local_exists(cfg.name):
            return ParkResult(name=cfg.name, backend=self.name, parked=True, already_parked=True)
        st = _status(cfg)
        skip, report = park_gate(cfg, if_idle_for, force, lambda: idle_report(st.dashboard_url or ""),
                                 lambda: refuse_shrink_below_running_jobs(cfg, 0, st))
        if skip:
            return skip
        saved = save_runs(cfg)
        shape = {"name": cfg.name, "nodes": st.gpu_node_count, "gpus_per_node": st.gpus_per_node,
                 "cpus_per_node": st.cpus_per_node, "parked_at": iso(time.time())}
        state.write_parked_local(cfg.name, shape)
        say(progress, f"stopping the processes of local cluster {cfg.name} (its shape is kept for 'resume')")
        local_ray.down(state.local_clusters_dir(), cfg.name)
        out = ParkResult(name=cfg.name, backend=self.name, parked=True, kept=shape, saved_runs=saved)
        if report:
            out.idle = report
        return out

    def resume(self, cfg: MilesRayConfig, *, wait: bool = True, ray_check: bool = True, timeout: float = 600,
               progress: Progress = None) -> LocalResume:
        """Start the nodes 'park' kept; a cluster that is not parked is only shown."""
        parked = state.read_parked_local(cfg.name)
        if parked is None:
            st = local_ray.status(state.local_clusters_dir(), cfg.name)  # NotFound when there is none
            return LocalResume(**st, resumed=False, reason="it was not parked")
        st = local_ray.up(state.local_clusters_dir(), cfg.name, parked["nodes"], parked["gpus_per_node"],
                          parked["cpus_per_node"], progress=progress, timeout=timeout)
        state.remove_parked_local(cfg.name)
        return LocalResume(**st, resumed=True)

    def down(self, cfg: MilesRayConfig) -> LocalDown:
        """Stop the processes (first saving the runs on it); a parked cluster only loses what 'park' kept."""
        if state.read_parked_local(cfg.name) is not None and not local_exists(cfg.name):
            state.remove_parked_local(cfg.name)  # parked: its processes are already gone
            return LocalDown(name=cfg.name, was_parked=True, saved_runs=SavedRuns(saved=[], not_saved={}))
        if not local_exists(cfg.name):  # already down: nothing to stop, and that is what 'down' wants
            return LocalDown(name=cfg.name, saved_runs=SavedRuns(saved=[], not_saved={}), already_down=True)
        stop_supervisors(saved_runs.records_on(cluster_addresses(cfg)))
        saved = save_runs(cfg)
        try:
            return LocalDown(**local_ray.down(state.local_clusters_dir(), cfg.name), saved_runs=saved)
        except NotFound:  # its processes had stopped: only its state was left (now removed)
            return LocalDown(name=cfg.name, saved_runs=saved, already_down=True)


def cluster_addresses(cfg: MilesRayConfig) -> list[str]:
    """Both addresses the cluster's head is known by in run records: ``local://NAME`` and its dashboard URL."""
    addresses = [f"{LOCAL_SCHEME}{cfg.name}"]
    try:
        addresses.append(local_ray.status(state.local_clusters_dir(), cfg.name)["dashboard_url"])
    except ClusterError:
        pass
    return addresses


def save_runs(cfg: MilesRayConfig) -> SavedRuns:
    """Save the jobs (every attempt's) and the supervisor events of the runs recorded on this cluster (by either
    address its head is known by)."""
    addresses = cluster_addresses(cfg)
    records = saved_runs.records_on(addresses)
    save_supervisor_events(records)
    return saved_runs.save_cluster_runs(records, addresses[0], kube_context=cfg.kube_context,
                                        kubeconfig=cfg.kubeconfig)


def refuse_shrink_below_running_jobs(cfg: MilesRayConfig, nodes: int, status: LocalStatus) -> None:
    """Refuse to remove GPU nodes that a running miles-ray job of this cluster needs (--force overrides)."""
    if nodes >= status.gpu_node_count:
        return
    for rec in state.RunStore.all():
        if rec.cluster != cfg.name or rec.address != status.dashboard_url:
            continue
        need = int((rec.split or {}).get("nodes", 0))
        if need > nodes and live_status(rec) in {"PENDING", "RUNNING"}:
            raise ConfigError(
                f"run {rec.run!r} is {live_status(rec)} and needs {need} GPU nodes; scaling to {nodes} would "
                "take GPUs from under it", hint="stop the run first, or pass --force")
