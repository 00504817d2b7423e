"""The typed results of the cluster verbs (up, status, scale, park, resume, down) on every backend.

Their ``-o json`` form is the dict the verbs printed before they were typed, key for key and in the same
order: a result keeps its keys in the order they were first given (at construction, then by assignment), as
the dict it replaces did; a key set only when it applies is a field with a default (see
:class:`miles_ray.core.results.Result`). Blocks an adapter returns as it reads them (pods, Ray's answer,
preflight reports, rendered objects) stay dicts inside the result."""

from __future__ import annotations

from typing import Any, Union

from pydantic import Field, PrivateAttr

from miles_ray.core.results import Result
from miles_ray.core.runs import SavedRuns
from miles_ray.services.queues import QueueCheck

Number = Union[int, float]  # kept as given: a count stays an int, a sum of floats a float


class Ordered(Result):
    """A result whose JSON keeps its keys in the order they were set, as the dict it replaces did: the keyword
    arguments' order, then each attribute set afterwards (``model_validate`` keeps the fields' order)."""

    _keys: list[str] = PrivateAttr(default_factory=list)

    def model_post_init(self, context: Any) -> None:
        self._keys = [name for name in type(self).model_fields if name in self.model_fields_set]

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        aliases = {f.alias: n for n, f in type(self).model_fields.items() if f.alias}
        self._keys = [aliases.get(k, k) for k in data]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_") and name not in self._keys:
            self._keys.append(name)

    def update(self, **values: Any) -> None:
        """Set several keys at once, in this order (as ``dict.update``)."""
        for k, v in values.items():
            setattr(self, k, v)

    def to_json(self) -> dict[str, Any]:
        dumped = super().to_json()
        fields = type(self).model_fields
        out: dict[str, Any] = {}
        for name in [*self._keys, *fields]:
            key = fields[name].alias or name
            if key in dumped and key not in out:
                value = getattr(self, name)
                out[key] = value.to_json() if isinstance(value, Result) else dumped[key]
        return out


class IdleReport(Ordered):
    """Is the cluster idle, and since when (``idle`` None: Ray cannot tell)."""

    idle: bool | None
    since: str | None = None
    idle_seconds: Number = 0
    last_job_end: str | None = None
    reason: str
    busy_jobs: list[str] = Field(default_factory=list)


# -- the local backend --------------------------------------------------------------------------------

class LocalCluster(Ordered):
    """The embedded local Ray cluster as its head reports it (what ``local_ray.status`` reads)."""

    name: str
    backend: str
    dashboard_url: str | None
    address: str | None
    gcs_address: str | None
    temp_dir: str | None
    ray_version: str | None
    auth: str
    created: str | None
    gpus_per_node: Any
    cpus_per_node: Any
    nodes: list[dict[str, Any]]
    dead_nodes: list[dict[str, Any]]
    alive_count: int
    dead_count: int
    gpu_node_count: int
    total_gpus: Number
    total_cpus: Number
    head_pid: int | None
    worker_pids: dict[str, int]


class LocalStatus(LocalCluster):
    """'status' of a running local cluster."""

    idle: IdleReport | None = None


class LocalUp(LocalCluster):
    """'up' (or 'resume') of a local cluster: started now, or already running."""

    already_running: bool
    requested_nodes: int = 0
    matches_request: bool = False
    up_seconds: Number = 0


class LocalScale(LocalCluster):
    added: list[int]
    removed: list[int]
    scale_seconds: Number
    recommended_split: dict[str, Any] = Field(default_factory=dict)
    split_summary: str = Field(default="", exclude=True)  # the recommended split in one line (not in the JSON)

    @property
    def gpus_each(self) -> int | None:
        """GPUs of each GPU worker, as the cluster was made."""
        return self.gpus_per_node


class LocalResume(LocalCluster):
    already_running: bool = False
    requested_nodes: int = 0
    matches_request: bool = False
    up_seconds: Number = 0
    resumed: bool
    reason: str = ""


class LocalDown(Ordered):
    """What stopping the local cluster's processes did."""

    pids: int = 0
    force_killed: int = 0
    left: list[Any] = Field(default_factory=list)
    seconds: Number = 0
    name: str
    was_parked: bool = False
    stopped_nodes: int = 0
    temp_dir: str | None = None
    saved_runs: SavedRuns
    already_down: bool = False  # set only when there was nothing to stop


# -- Kubernetes (KubeRay, Polyaxon) -----------------------------------------------------------------

class KubeStatus(Ordered):
    """A RayCluster as Kubernetes (and, with ``ray``, Ray) reports it."""

    name: str
    backend: str
    via: str
    raycluster: str
    namespace: str
    desired_workers: int
    ready_workers: int
    gpus_per_worker: int
    desired_gpus: int
    ready_gpus: int
    state: str | None
    conditions: list[dict[str, Any]]
    generation: int | None
    observed_generation: int | None
    pods: list[dict[str, Any]]
    head_service: str
    dashboard_url: str
    nodes: list[dict[str, Any]]
    gpu_node_count: int
    total_gpus: int
    queue: dict[str, Any] = Field(default_factory=dict)
    polyaxon_uuid: str | None = None
    polyaxon_status: str | None = None
    ray_nodes_alive: int | None = None
    ray_gpus: Number = 0
    ray_node_ips: list[str] = Field(default_factory=list)
    ray_error: str = ""
    ray: dict[str, Any] = Field(default_factory=dict)
    idle: IdleReport | None = None


class PolyaxonRunStatus(Ordered):
    """A Polyaxon-made cluster seen through Polyaxon only (no kubeconfig): its run's status and conditions."""

    name: str
    backend: str
    via: str
    kubernetes: bool
    namespace: str | None
    raycluster: str | None
    polyaxon_uuid: str
    polyaxon_project: str
    polyaxon_status: str | None
    polyaxon_conditions: list[dict[str, Any]]
    notices: list[str]
    idle: IdleReport | None = None


class DownCluster(Ordered):
    """A cluster 'down' took away (its Polyaxon run stopped and deleted), as Polyaxon sees its run now."""

    name: str
    backend: str
    via: str
    state: str
    down: bool
    down_at: str | None
    namespace: str | None
    raycluster: str | None
    polyaxon_uuid: str
    polyaxon_project: str
    polyaxon_status: str | None = None
    polyaxon_deleting: bool = False
    already_down: bool = False
    saved_runs: SavedRuns | None = None


class ParkedCluster(Ordered):
    """What 'park' kept of a parked local or Polyaxon cluster ('status' shows it)."""

    name: str
    backend: str
    via: str = ""
    parked: bool
    nodes: Any = None
    gpus_per_node: Any = None
    cpus_per_node: Any = None
    parked_at: str | None = None
    stopped_uuid: str | None = None


ClusterStatus = Union[LocalStatus, KubeStatus, PolyaxonRunStatus, DownCluster, ParkedCluster]
"""What 'status' shows of a cluster: one of these, by backend and state."""


class Preflight(Ordered):
    """What 'up' checked on Kubernetes before creating anything (``skipped``: why it was not run)."""

    skipped: str = ""
    crd_versions: list[str] = Field(default_factory=list)
    queue: QueueCheck | None = None
    gpu_nodes: int = 0
    gpu_nodes_fitting: int | None = None
    ray_token_secret: str = ""
    gcs_ft: str = ""


class KubeUp(Ordered):
    """'up' on Kubernetes: the preflight, what was (or would be) created, and (``wait``) the cluster's status."""

    name: str
    namespace: str
    via: str
    preflight: Preflight
    warnings: list[str]
    notices: list[str] = Field(default_factory=list)
    kubernetes: bool = True
    dry_run: str | None = None
    created: bool = False
    polyaxon_uuid: str = ""
    raycluster: Union[str, dict[str, Any], None] = None
    operation: dict[str, Any] = Field(default_factory=dict)
    status: Union[KubeStatus, PolyaxonRunStatus, None] = None


UpResult = Union[LocalUp, KubeUp]


class KubeScale(Ordered):
    """'scale' on Kubernetes: from and to how many workers; (``wait``) then the cluster's status, merged in."""

    name: str
    raycluster: str
    from_: int | None = Field(alias="from")
    to: int
    adjusted: list[str]
    gpus_per_worker: int
    backend: str = ""
    via: str = ""
    namespace: str = ""
    desired_workers: int = 0
    ready_workers: int = 0
    desired_gpus: int = 0
    ready_gpus: int = 0
    state: str | None = None
    conditions: list[dict[str, Any]] = Field(default_factory=list)
    generation: int | None = None
    observed_generation: int | None = None
    pods: list[dict[str, Any]] = Field(default_factory=list)
    head_service: str = ""
    dashboard_url: str = ""
    nodes: list[dict[str, Any]] = Field(default_factory=list)
    gpu_node_count: int = 0
    total_gpus: int = 0
    queue: dict[str, Any] = Field(default_factory=dict)
    polyaxon_uuid: str | None = None
    polyaxon_status: str | None = None
    ray_nodes_alive: int | None = None
    ray_gpus: Number = 0
    ray_node_ips: list[str] = Field(default_factory=list)
    ray_error: str = ""
    ray: dict[str, Any] = Field(default_factory=dict)
    recommended_split: dict[str, Any] = Field(default_factory=dict)
    split_summary: str = Field(default="", exclude=True)  # the recommended split in one line (not in the JSON)

    @property
    def gpus_each(self) -> int | None:
        """GPUs of each GPU worker, as the cluster was made."""
        return self.gpus_per_worker

    @property
    def waited(self) -> bool:
        """Whether the cluster's status was read after waiting (it is merged in)."""
        return "pods" in self.model_fields_set

    def with_status(self, status: KubeStatus) -> None:
        """Merge the cluster's status in (after waiting), as the dict did with ``update``."""
        self.update(**{k: getattr(status, k) for k in status._keys if k in type(self).model_fields})


ScaleResult = Union[LocalScale, KubeScale]


class ParkResult(Ordered):
    """'park': parked (or already), or not parked and why (``--if-idle-for``)."""

    name: str
    backend: str = ""
    via: str = ""
    raycluster: str = ""
    namespace: str = ""
    parked: bool
    reason: str = ""
    already_parked: bool = False
    operation_of: str = ""
    kept: dict[str, Any] = Field(default_factory=dict)
    idle: IdleReport | None = None
    saved_runs: SavedRuns | None = None
    stopped_uuid: str = ""
    grace_cut: list[str] = Field(default_factory=list)  # Polyaxon-made pods deleted at once once Ray had stopped


class KubeResume(Ordered):
    """'resume' on Kubernetes: unsuspended (KubeRay) or created again (Polyaxon), or not parked."""

    name: str
    via: str = ""
    raycluster: str = ""
    namespace: str = ""
    resumed: bool = False
    reason: str = ""
    polyaxon_uuid: str | None = None
    resumed_from: str = ""
    status: Union[KubeStatus, PolyaxonRunStatus, None] = None


ResumeResult = Union[LocalResume, KubeResume]


class KubeDown(Ordered):
    """'down' on Kubernetes: the RayCluster deleted (and the Polyaxon run stopped and deleted)."""

    name: str
    raycluster: str
    namespace: str
    storage: str
    polyaxon_stopped: str = ""
    polyaxon_deleted: str = ""
    kubernetes: bool = True
    notices: list[str] = Field(default_factory=list)
    deleted: bool = False
    pods_remaining: int = 0
    grace_cut: list[str] = Field(default_factory=list)  # Polyaxon-made pods deleted at once once Ray had stopped
    saved_runs: SavedRuns | None = None
    already_down: bool = False  # set only when there was nothing to delete


DownResult = Union[LocalDown, KubeDown, DownCluster]
