"""Every Miles run on a Polyaxon-made cluster is a Polyaxon run, whatever its --mode.

``submit`` creates it -- in the same Polyaxon project as the cluster, on the host the cluster's record keeps -- as a
NON-MANAGED run (``is_managed=False``): a record Polyaxon holds and a client keeps current through its API, with no
agent, no operation and no pod of its own. Why that way: the Miles image has no ``polyaxon`` package, so nothing in
the Miles job can log to Polyaxon; Polyaxon itself supports runs kept up to date from outside through the API
(``managed_by=user``), and the run supervisor, which runs ON the cluster (Polyaxon's sidecar image on Kubernetes,
which every Polyaxon cluster already pulls and which has python3 + polyaxon; this venv's python on the embedded
cluster), keeps it current with ``launchers/polyaxon_report.py`` through Polyaxon's own client (status, driver logs,
Miles metrics, checkpoint lineage). The user's terminal has no part in it once ``submit`` returned.

The run's inputs are the run's request (:func:`miles_ray.core.polyaxon_runs.run_inputs`): recipe and recipe hash,
split, image and its digest, model and dataset revisions, Miles commit, the exact command line of the job, mode,
output and checkpoint dirs. The supervisor's spec names the run (:func:`miles_ray.core.polyaxon_runs.reporter_section`).

A cluster is Polyaxon-made when its record says so (``via: polyaxon`` with ``polyaxon_owner`` /
``polyaxon_project``, and the host in ``polyaxon_host``): the record ``up --via polyaxon`` writes for a Kubernetes
cluster; the state file of the embedded cluster serving the head when it carries the same keys.

Bad input creates nothing: the project is checked (and the host reached) before anything is submitted to Ray; a
Polyaxon run made for a submission that then fails is deleted again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from miles_ray.adapters import local_ray, state
from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns, sidecar_image
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError, NotFound
from miles_ray.core.heads import parse_head
from miles_ray.core.polyaxon_runs import reporter_section, run_inputs
from miles_ray.core.progress import Progress, say
from miles_ray.core.records import Controller, PolyaxonRef, RunRecord, as_record
from miles_ray.core.submission import SubmitJob, supervisor_kind
from miles_ray.services import polyaxon_where
from miles_ray.services.runs.supervised import supervisor_kinds

@dataclass(frozen=True)
class PolyaxonHome:
    """Where a Polyaxon-made cluster's runs go: its Polyaxon host, owner and project; ``host_in_cluster``: the same
    API as the cluster's pods reach it (where a supervisor pod reports), default ``host``."""

    host: str
    owner: str
    project: str
    host_in_cluster: str | None = None

    def ref(self, uuid: str | None = None) -> PolyaxonRef:
        return PolyaxonRef(host=self.host, owner=self.owner, project=self.project, uuid=uuid, role="tracked")

    def runs(self) -> TrackedRuns:
        return TrackedRuns(polyaxon_where.client(self.ref()), self.owner, self.project)


def _cluster_record(cfg: MilesRayConfig, address: str) -> dict[str, Any] | None:
    """The record of the cluster whose head is ``address``: ``up``'s record of a RayCluster, or an embedded
    cluster's state file."""
    head = parse_head(address)
    if head.namespace is not None:
        return state.find_kube_cluster(cfg.kube_context, head.namespace, head.name or "")
    if head.on_this_machine:  # the embedded cluster whose dashboard it is
        for name in state.local_cluster_names()[0]:
            rec = local_ray.read_state(state.local_clusters_dir(), name) or {}
            if rec.get("dashboard_url") == address:
                return rec
    return None


def polyaxon_home(cfg: MilesRayConfig, address: str) -> PolyaxonHome | None:
    """The Polyaxon project of the cluster at ``address`` when its record says Polyaxon made it, else None. A
    record without the host (made before miles-ray kept it): the configured host, else ``$POLYAXON_HOST``."""
    rec = _cluster_record(cfg, address) or {}
    if rec.get("via") != "polyaxon" or not rec.get("polyaxon_project"):
        return None
    # the cluster's project as its record keeps it (the host: else the configured one), not the config's
    ref = polyaxon_where.resolve("tracked", rec, cfg)
    host = ref.host or os.environ.get("POLYAXON_HOST")
    if not host:
        raise ConfigError(f"the cluster at {address} was made through Polyaxon (project "
                          f"{ref.owner}/{ref.project}) but its record does not say on which Polyaxon host",
                          hint="set polyaxon_host in miles-ray.yaml or POLYAXON_HOST")
    in_cluster = rec.get("polyaxon_host_in_cluster") or cfg.polyaxon_host_in_cluster
    return PolyaxonHome(host=str(host), owner=ref.owner, project=str(ref.project),
                        host_in_cluster=str(in_cluster) if in_cluster else None)


def tracked_kind(job: SubmitJob) -> bool:
    """The runs that get a non-managed Polyaxon run: those that run as a Ray job (direct mode, a rehearsal). A
    launcher on a Kubernetes head is a Polyaxon job already (:mod:`.polyaxon_job`)."""
    return job.kind == "ray-job"


def preflight(cfg: MilesRayConfig, job: SubmitJob, progress: Progress = None) -> PolyaxonHome | None:
    """Before anything is submitted: the Polyaxon project of the run's cluster must exist and answer (one typed
    error line otherwise: NotFound, Forbidden, Unreachable). None: the run gets no Polyaxon run."""
    if not tracked_kind(job):
        return None
    home = polyaxon_home(cfg, job.address)
    if home is None:
        return None
    kind = (job.supervision or {}).get("kind") or supervisor_kind(job.address)
    if kind not in supervisor_kinds():
        raise ConfigError(f"a run on the Polyaxon-made cluster at {job.address} is a Polyaxon run kept current by a "
                          f"run supervisor on the cluster, and a {kind} supervisor is not available in this miles-ray",
                          hint="upgrade miles-ray, or submit to a cluster not made through Polyaxon")
    api = polyaxon_where.client(home.ref(), retries=1)
    say(progress, f"checking Polyaxon project {home.owner}/{home.project} at {api.host} (the cluster's)")
    try:
        api.check_project(home.owner, home.project)
    except NotFound as e:
        raise NotFound(f"{e.message}: the cluster at {job.address} was made in it, and its runs are recorded there",
                       hint=f"create it ('polyaxon project create --name {home.project}') or check the cluster's "
                            "Polyaxon host") from None
    return home


def track(job: SubmitJob, home: PolyaxonHome, progress: Progress = None) -> SubmitJob:
    """Create the run's non-managed Polyaxon run (or find the one an earlier submit of this run made); the job with
    its record naming it (``polyaxon_run_uuid`` and where: host, owner, project) and its supervisor's spec the
    ``polyaxon`` section its reporter reads."""
    rec = as_record(job.record)
    runs = home.runs()
    say(progress, f"creating Polyaxon run {rec.run} in {home.owner}/{home.project}")
    uuid = runs.create(rec.run, inputs=run_inputs(job.record), tags=["miles-ray", f"mode:{rec.mode}"],
                       meta={"miles_ray_run": rec.run, "submission_id": rec.submission_id,
                             "recipe_hash": rec.recipe_hash},
                       description=f"Miles run {rec.run} (recipe {rec.recipe}), a Ray job on "
                                   f"{rec.address}; kept current by its supervisor on the cluster")
    # its supervisor reports to it: a run that would not be supervised (--max-restarts 0, no checkpoints, a
    # rehearsal) gets one that never restarts it
    supervision = dict(job.supervision or {"kind": supervisor_kind(job.address), "max_restarts": 0,
                                           "checkpoint_dir": rec.checkpoint_dir})
    record = rec.model_copy(update={
        "polyaxon_run_uuid": uuid, "polyaxon_host": runs.api.host, "polyaxon_owner": home.owner,
        "polyaxon_project": home.project, "polyaxon_tracked": True,
        "supervisor": rec.supervisor or Controller(kind=supervision["kind"], max_restarts=0)}).dump()
    pod = supervision["kind"] == "kubernetes"  # the supervisor runs in a pod: the API as pods reach it
    supervision["polyaxon"] = reporter_section(record, image=sidecar_image(),
                                               host=home.host_in_cluster if pod else None)
    return replace(job, record=record, supervision=supervision)


def untrack(record: RunRecord | dict[str, Any]) -> None:
    """The submission failed after its Polyaxon run was made: delete that run (best effort: the error that failed
    the submission is the one to report)."""
    where = _where(record)
    if where is None:
        return
    runs, uuid = where
    try:
        runs.delete(uuid)
    except ClusterError:
        pass


def _where(record: RunRecord | dict[str, Any]) -> tuple[TrackedRuns, str] | None:
    rec = as_record(record)
    ref = rec.polyaxon("tracked")
    if not rec.polyaxon_tracked or not ref.uuid:
        return None
    return TrackedRuns(polyaxon_where.client(ref), ref.owner, str(ref.project)), ref.uuid


def stop(record: RunRecord | dict[str, Any]) -> str | None:
    """``stop RUN``: the run's Polyaxon run stopped too (left as it is when it has ended); its status after, None
    for a run without one."""
    where = _where(record)
    if where is None:
        return None
    runs, uuid = where
    return runs.stop(uuid)
