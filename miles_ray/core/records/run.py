"""The run record: the provenance kept with every submitted run, as one typed model with typed parts (the head its
job started on, its attempts, its supervisor, where its Polyaxon run lives). Pure; read and written by
:mod:`miles_ray.adapters.state` (records of every older shape are brought to this one by
:mod:`miles_ray.core.records.upgrade`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from miles_ray.core.records.polyaxon_ref import PolyaxonRef, Role, polyaxon_ref

SCHEMA = "miles-ray/run-record/v2"
# Where a record's checkpoint dirs come from: the job's own train.py command line (direct mode); the one direct mode
# would run (a rehearsal writes nothing); the catalog's capture of the upstream launcher (launcher mode: the
# launcher decides); nothing known (launcher mode, a recipe without captured flags). A record written before
# miles-ray kept them (see core.records.upgrade): a direct-mode job's own command line (entrypoint), else
# <output_dir>/checkpoints assumed.
CheckpointSource = Literal["job", "rehearsed-job", "launcher-capture", "unknown", "entrypoint", "assumed"]



def _uses(provenance: int | None = None, request: bool = False) -> dict[str, Any]:
    """A field's part in the record's uses (its ``json_schema_extra``): ``provenance`` its place among what produced
    the run (compared between runs, kept with a registered model, in that order), ``request`` whether it is part of
    what was asked (a submit again under the same run name may not change it)."""
    return {"provenance": provenance, "request": request}



class Part(BaseModel):
    """A typed part of a record: its keys as written, the ones it does not know kept (a newer or older miles-ray
    wrote them), and written back with only the keys it was given (a record is never padded with nulls)."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_given(self, handler):
        data = handler(self)
        given = self.model_fields_set | set(self.__pydantic_extra__ or {})
        return {k: v for k, v in data.items() if k in given}


class Head(Part):
    """The Ray head a job started on: Ray's head node id and, on Kubernetes, its pod (NAMESPACE/NAME) and uid."""

    node_id: str | None = None
    pod: str | None = None
    pod_uid: str | None = None


class Attempt(Part):
    """One attempt of a run, as its record keeps it: an unsupervised run's (started by submit; ``lost`` once its job
    was lost with its head) and a supervised run's (as its supervisor said, see miles_ray.core.supervision)."""

    attempt: int | None = None
    submission_id: str | None = None
    started: str | None = None
    head: Head | None = None
    resumed_from: str | None = None  # the checkpoint dir it loaded from
    ended: str | None = None
    status: str | None = None
    reason: str | None = None
    lost: bool | None = None
    serving_head: Head | None = None


class Controller(Part):
    """A supervised run's supervisor (submit --max-restarts N > 0): its ``kind`` (local | kubernetes) and restart
    budget; once started ``where`` (its handle's) and ``started``; ``stopped_at`` once 'stop' stopped it."""

    kind: str | None = None
    max_restarts: int | None = None
    where: dict[str, Any] | None = None
    started: str | None = None
    stopped_at: str | None = None
    keep_checkpoints: int | None = None  # its retention: the newest N checkpoints kept (see core.supervision)
    keep_best: str | None = None  # and the best one by this metric


class RunRecord(BaseModel):
    # keys this model does not know are kept as written (a newer miles-ray's, or a user's own notes)
    model_config = ConfigDict(extra="allow", populate_by_name=True, validate_assignment=True)

    schema_: str = Field(SCHEMA, alias="schema")
    run: str
    cluster: str = Field(json_schema_extra=_uses(provenance=12))
    backend: Literal["local", "kuberay", "address"]
    address: str
    submission_id: str
    mode: Literal["direct", "launcher", "rehearse"] = Field(json_schema_extra=_uses(provenance=11, request=True))
    created: str = Field(json_schema_extra=_uses(provenance=14))
    image: str | None = Field(json_schema_extra=_uses(provenance=3, request=True))
    image_digest: str | None = Field(json_schema_extra=_uses(provenance=4))
    ray_version: str | None = Field(json_schema_extra=_uses(provenance=8))
    # the image's (read by the probe in direct mode, else --miles-commit)
    miles_commit: str | None = Field(None, json_schema_extra=_uses(provenance=5))
    miles_version: dict[str, Any] | None = None  # direct mode: catalog vs image commit (miles_ray.core.miles_version)
    model_revision: str | None = Field(None, json_schema_extra=_uses(provenance=6, request=True))
    dataset_revision: str | None = Field(None, json_schema_extra=_uses(provenance=7, request=True))
    recipe: str = Field(json_schema_extra=_uses(provenance=1, request=True))
    recipe_hash: str = Field(json_schema_extra=_uses(provenance=2, request=True))
    recipe_spec: dict[str, Any]
    split: dict[str, Any]
    output_dir: str = Field(json_schema_extra=_uses(provenance=9))
    resumed_from: str | None = Field(None, json_schema_extra=_uses(provenance=10, request=True))
    entrypoint: str = Field(json_schema_extra=_uses(request=True))
    # where the job saves checkpoints (train.py --save) and loads them from (--load), as known per
    # checkpoint_dirs_from
    checkpoint_dir: str | None = None
    load_dir: str | None = None
    checkpoint_dirs_from: CheckpointSource | None = None
    kube_context: str | None = None  # how a k8s:// address was reached when the run was submitted
    kubeconfig: str | None = None
    # the run's Polyaxon run (see polyaxon()): --mode launcher on Kubernetes, the Polyaxon job running the launcher;
    # a tracked run (polyaxon_tracked), its non-managed Polyaxon run
    polyaxon_run_uuid: str | None = Field(None, json_schema_extra=_uses(provenance=13))
    polyaxon_owner: str | None = None
    polyaxon_project: str | None = None
    # the Polyaxon API host the run was created on (status/logs/stop reach it there again); kept once the job is
    # created (the prepared record leaves it out: see RECORDED_ON_CREATION)
    polyaxon_host: str | None = None
    # a run with a non-managed Polyaxon run of its own (a Ray job on a Polyaxon-made cluster, kept current by its
    # supervisor: miles_ray.services.runs.polyaxon_tracked); set when the job is created
    polyaxon_tracked: bool | None = None
    # the head the current attempt's job started on and the run's attempts, oldest first: kept in the record of a
    # created job only
    head: Head | None = None
    attempts: list[Attempt] | None = None
    supervisor: Controller | None = None  # a supervised run: its controller, the run supervisor
    # set only when submit ran with --no-memory-check: the memory estimate was not enforced
    memory_check: str | None = None
    # in a copy naming one attempt's job (see job_of_attempt; never written): the run's own submission id
    run_submission_id: str | None = Field(None, exclude=True)

    # -- what the record is read for -------------------------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        """The record as it is written: the keys it was given (never padded with nulls), by their names on disk, in
        the order of its file (keys sorted at every level, as the state dir writes them)."""
        return _sorted(self.model_dump(mode="json", by_alias=True, exclude_unset=True))

    @classmethod
    def fields_for(cls, use: Literal["provenance", "request"]) -> tuple[str, ...]:
        """The fields (names on disk) a use reads, in its order (see :func:`_uses`)."""
        marked = [(f.json_schema_extra[use], f.alias or name) for name, f in cls.model_fields.items()
                  if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(use)]
        return tuple(name for _, name in sorted(marked, key=lambda m: (m[0] is True, m[0])))

    def provenance(self) -> dict[str, Any]:
        """What produced the run (recipe and hash, image, revisions, split, dirs, cluster, ...), by field."""
        data = self.dump()
        return {k: data.get(k) for k in self.fields_for("provenance")}

    def request_fields(self) -> dict[str, Any]:
        """What the run was asked to be: what a submit again under the same run name may not change."""
        data = self.dump()
        return {k: data.get(k) for k in self.fields_for("request")}

    def split_key(self) -> dict[str, Any]:
        return split_key(self.split)

    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def lost_attempt(self) -> Attempt | None:
        """The current attempt if its job was lost with its head (see :meth:`mark_lost`), else None."""
        attempt = self.current_attempt()
        return attempt if attempt is not None and attempt.lost else None

    def mark_lost(self, at: str, why: str, now: dict[str, Any] | None) -> "RunRecord":
        """The record with its current attempt ended FAILED: its job was lost with the head it ran on (at ``at``,
        when that was found; ``now``: the head serving then, if any). A record without attempts (written before
        them) gets its attempt 1 from its own submission id, creation and head."""
        attempts = [a.model_copy(deep=True) for a in self.attempts or []] or [Attempt.model_validate(
            {"attempt": 1, "submission_id": self.submission_id, "started": self.created,
             "head": self.head.model_dump() if self.head is not None else None})]
        attempts[-1] = Attempt.model_validate({**attempts[-1].model_dump(), "ended": at, "status": "FAILED",
                                               "reason": f"head lost at {at}: {why}", "lost": True,
                                               "serving_head": dict(now) if now else None})
        return self.model_copy(update={"attempts": attempts})

    def job_of_attempt(self, submission_id: str) -> "RunRecord":
        """A copy naming one attempt's job (``submission_id``; ``run_submission_id``: the run's), never saved."""
        copy = self.model_copy(update={"submission_id": submission_id})
        copy.run_submission_id = self.run_submission_id or self.submission_id
        return copy

    def polyaxon(self, role: Role | None = None, *, host: str | None = None) -> PolyaxonRef:
        """Where the run's Polyaxon run lives (see :func:`miles_ray.core.records.polyaxon_ref.polyaxon_ref`)."""
        role = role or ("tracked" if self.polyaxon_tracked else "launcher-job")
        return polyaxon_ref(role, self.dump(), host=host)


def split_key(split: dict[str, Any]) -> dict[str, Any]:
    """What must match for a checkpoint to be reused: the parallel layout Miles saved with."""
    keys = ("layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
            "rollout_num_gpus_per_engine")
    return {k: split.get(k) for k in keys}


# fields a prepared record (dry runs print it) leaves out: set when the job is created
RECORDED_ON_CREATION = frozenset({"polyaxon_host", "polyaxon_tracked", "head", "attempts"})


def _sorted(value: Any) -> Any:
    """``value`` with the keys of every dict in it sorted (what ``json.dump(sort_keys=True)`` writes)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
