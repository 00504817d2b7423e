"""The job a valid request makes on a target head (:func:`prepare_submit`): entrypoint, runtime env, submission id,
metadata, run record, output dir, the launcher command or its Polyaxon operation, and whether (and where) a supervisor
keeps it running."""

from __future__ import annotations

import copy
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from miles_ray.core.builders import ray_auth_env
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import (checkpoint_dirs, default_run_name, direct_argv, direct_job_env,
                                       filled_train_args, job_env, launcher_argv, launcher_job_operation,
                                       rehearsal_entrypoint, submission_id)
from miles_ray.core.errors import ConfigError
from miles_ray.core.heads import in_cluster_url, parse_head
from miles_ray.core.planner import Plan
from miles_ray.core.recipes import Recipe
from miles_ray.core.records import Controller, as_record
from miles_ray.core.runs import (RECORDED_ON_CREATION, ResumeTarget, RunRecord, SCHEMA, attempt_submission_id,
                                 head_identity, new_attempt, resume_differences, resume_target, run_id_of)
from miles_ray.core.submission.live import check_head_ray_version
from miles_ray.core.submission.resubmit import refuse_changed_request
from miles_ray.core.submission.validation import SubmitRequest, ValidRequest
from miles_ray.core.supervision import DEFAULT_MAX_RESTARTS, SPEC_SCHEMA


REHEARSAL_DRIVER = "rehearse.py"
_RECORDED_SPLIT = {"layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
                   "rollout_num_gpus_per_engine", "miles_args", "colocate"}


def supervisor_kind(address: str) -> str:
    """Where a run's supervisor lives: ``kubernetes`` (a Kubernetes Job beside a KubeRay head, Polyaxon-made or
    not), ``local`` (a detached process on this machine)."""
    return "kubernetes" if parse_head(address).kind == "kubernetes" else "local"


@dataclass(frozen=True)
class SubmitTarget:
    """Where the job goes: the backend that made the head (local, kuberay, address), the head's
    address as stored in run records (``miles_ray.core.heads``), and the python its job drivers run with."""

    backend: str
    address: str
    python: str = "python3"
    # the head's Ray auth as far as known without reading the cluster: (mode, the Secret holding its token)
    head_auth: tuple[str, str | None] | None = None
    # the kinds of run supervisor that can be started (miles_ray.services.runs.supervised.HANDLES)
    supervisors: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SubmitJob:
    """Everything submit creates, complete before any I/O.

    ``kind``: ``ray-job`` (submitted through the Jobs API), ``launcher-exec`` (the upstream launcher replaces
    this process) or ``launcher-polyaxon`` (the launcher as a Polyaxon job in the cluster, ``operation``).
    ``existing``: the record of a run of this name (a re-submit returns its job when the head still has it);
    ``reconcile_error``: why that run cannot be submitted again when its job is gone.
    """

    kind: Literal["ray-job", "launcher-exec", "launcher-polyaxon"]
    run: str
    submission_id: str
    address: str
    in_cluster_address: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    record: dict[str, Any]
    output_dir: str
    resumed_from: str | None
    plan: Plan
    recipe: Recipe
    check_data: bool
    resume: ResumeTarget | None  # a resumed run: its output dir and the checkpoint dir it loads from
    wait_for_nodes: bool
    timeout: float
    launcher_argv: list[str] | None = None
    operation: dict[str, Any] | None = None
    existing: dict[str, Any] | None = None
    reconcile_error: ConfigError | None = None
    warnings: tuple[str, ...] = ()
    attempt: int = 1  # the run's attempt this job is (2, 3...: its job was lost with its head, see new_attempt)
    replaces: dict[str, Any] | None = None  # a new attempt: the run's record before it (put back if Ray refuses)
    # a supervised run: what its supervisor's spec needs beyond the first job (kind, max_restarts, resume_job,
    # checkpoint_dir, gpu_workers, gpus_per_node, workers_timeout); None: not supervised
    supervision: dict[str, Any] | None = None

    @property
    def run_record(self) -> RunRecord:
        """Its run record, typed."""
        return as_record(self.record)

    @property
    def existing_record(self) -> RunRecord | None:
        """The record of a run of this name, typed (None: a new run)."""
        return as_record(self.existing) if self.existing is not None else None

    def with_head(self, node_id: str | None, pod: Mapping[str, str] | None, started: str) -> "SubmitJob":
        """The job with the head it is submitted to in its record (``head``) and its attempt in ``attempts``: what
        the run verbs compare with the head serving later (a job whose head is gone is lost)."""
        head = head_identity(node_id, pod)
        attempts = new_attempt(self.replaces, self.submission_id, started, head, self.record.get("load_dir")
                               if self.resume else None)
        return replace(self, record={**self.record, "head": head, "attempts": attempts})

    def supervisor_spec(self, head_url: str, token_file: str | None) -> dict[str, Any]:
        """The JSON spec of this supervised run's supervisor (``miles_ray.core.supervision.SupervisorSpec``),
        reaching the head at ``head_url`` with the token in ``token_file`` (None: no token)."""
        sup = self.supervision or {}
        spec = {"schema": SPEC_SCHEMA, "run": self.run, "head_url": head_url, "token_file": token_file,
                "submission_id": self.submission_id, "max_restarts": sup.get("max_restarts", 0),
                "first_job": {"entrypoint": self.entrypoint, "runtime_env": self.runtime_env,
                              "metadata": self.metadata},
                "resume_job": sup.get("resume_job"), "checkpoint_dir": sup.get("checkpoint_dir"),
                "gpu_workers": sup.get("gpu_workers", 0), "gpus_per_node": sup.get("gpus_per_node", 0),
                "workers_timeout": sup.get("workers_timeout", 600.0)}
        for key in ("keep_checkpoints", "keep_best"):  # the retention (absent: keep every checkpoint)
            if sup.get(key) is not None:
                spec[key] = sup[key]
        if sup.get("polyaxon"):
            spec["polyaxon"] = sup["polyaxon"]
        return spec

    def with_head_auth(self, mode: str, secret: str | None) -> "SubmitJob":
        """The launcher job with the head's own Ray auth (read from its head pod): the token by reference to the
        Secret the head itself reads it from, so the job always names the right one."""
        if self.operation is None:
            return self
        op = copy.deepcopy(self.operation)
        container = op["component"]["run"]["container"]
        container["env"] = ([e for e in container["env"] if not e["name"].startswith("RAY_AUTH_")]
                            + ray_auth_env(mode, secret))
        return replace(self, operation=op)

    def with_head_ray_version(self, cfg: MilesRayConfig, live: str | None) -> "SubmitJob":
        """The job with the head's own Ray version recorded (see :func:`check_head_ray_version`)."""
        version = check_head_ray_version(cfg.ray_version, live)
        return replace(self, record={**self.record, "ray_version": version})


def prepare_submit(cfg: MilesRayConfig, valid: ValidRequest, target: SubmitTarget, *, created: str,
                   launchers_dir: str, existing: dict[str, Any] | None = None,
                   resume: dict[str, Any] | None = None, environ: Mapping[str, str] | None = None,
                   replaces: dict[str, Any] | None = None) -> SubmitJob:
    """The complete job for ``valid`` on ``target``.

    ``created``: the submit time (ISO, UTC; names an unnamed run). ``launchers_dir``: the payload directory
    shipped with a rehearsal. ``existing``: the record already stored under the run's name, if any. ``resume``:
    the record of the run named by --resume-from (its output dir and checkpoints are reused). ``environ``: the
    environment submit runs in; a direct-mode job takes MASTER_ADDR, the NCCL/GLOO settings and PYTHONPATH from
    it as the upstream launcher does from its own (:func:`miles_ray.core.entrypoint.direct_job_env`).
    ``replaces``: the record of this same run whose job was lost with its head: the job is its next attempt
    (submission id ``<run's>-a<N>``; it keeps the run's creation time)."""
    request, recipe, plan, image = valid.request, valid.recipe, valid.plan, valid.image
    head = parse_head(target.address)
    if request.mode == "launcher" and head.kind == "kubernetes" and image is None:
        raise ConfigError("--mode launcher on a Kubernetes cluster runs the launcher as a Polyaxon job in the Miles "
                          "image: an image is needed", hint="pass --image repo@sha256:<64 hex>")
    run = request.run or default_run_name(recipe, plan, created)
    replaced = as_record(replaces) if replaces is not None else None
    attempt = len(replaced.attempts or [None]) + 1 if replaced is not None else 1
    sid = attempt_submission_id(submission_id(cfg.name, run), attempt)
    if replaced is not None:
        created = replaced.created or created

    reconcile_error = None
    if existing is not None and as_record(existing).address != target.address:
        raise ConfigError(f"run {run!r} already exists on another cluster ({as_record(existing).address})",
                          hint="pick another --run name")

    output_dir, resumed_from, resuming = cfg.output_dir(run), None, None
    if resume is not None:
        diffs = resume_differences(as_record(resume), recipe.content_hash(), plan.model_dump())
        if diffs and not request.force:
            raise ConfigError(f"--resume-from {as_record(resume).run}: checkpoints were written with a different setup: "
                              + "; ".join(diffs), hint="pass --force to reuse them anyway")
        resuming = resume_target(resume)  # where it saved: the new job loads from there
        output_dir, resumed_from = resuming.output_dir, resuming.run

    in_cluster = in_cluster_url(target.address)
    # The launcher's --run-id: its checkpoints may live under <output dir>/<run id>, so a resumed run keeps the
    # name its output dir was made for.
    run_id = run_id_of(output_dir)
    load_dir = resuming.checkpoint_dir if resuming else None
    direct = request.mode == "direct" and not request.rehearse
    env_vars = (direct_job_env(cfg, in_cluster, recipe, environ or {}, valid.env) if direct
                else job_env(cfg, in_cluster, valid.env))
    runtime_env: dict[str, Any] = {"env_vars": env_vars}
    argv = None
    # Where the job saves and loads checkpoints: train.py's --save / --load (see miles_ray.core.runs.Checkpoints)
    ckpt: tuple[str | None, str | None] = (None, None)
    if request.rehearse:
        entrypoint = rehearsal_entrypoint(REHEARSAL_DRIVER, plan, max(10, min(request.timeout, 600)), request.hold,
                                          request.extra_args)
        if target.python != "python3":
            entrypoint = entrypoint.replace("python3", target.python, 1)
        runtime_env["working_dir"] = launchers_dir
        ckpt_from = "rehearsed-job" if recipe.train_args else "unknown"
        if recipe.train_args:
            ckpt = checkpoint_dirs(direct_argv(cfg, recipe, plan, output_dir, run_id, request.extra_args,
                                               num_rollout=request.num_rollout, load_dir=load_dir))
    elif request.mode == "direct":
        job_argv = direct_argv(cfg, recipe, plan, output_dir, run_id, request.extra_args,
                               num_rollout=request.num_rollout, load_dir=load_dir)
        entrypoint, ckpt, ckpt_from = shlex.join(job_argv), checkpoint_dirs(job_argv), "job"
    else:
        argv = launcher_argv(cfg, recipe, plan, output_dir, run_id, request.extra_args)
        entrypoint = " ".join(argv)
        # the launcher builds train.py's command line itself (with --extra-args at its end): what its captured job
        # passes is what can be known
        ckpt_from = "launcher-capture" if recipe.train_args else "unknown"
        if recipe.train_args:
            ckpt = checkpoint_dirs([*filled_train_args(cfg, recipe, output_dir, run_id), *request.extra_args])
        if resuming and ckpt[1] != resuming.checkpoint_dir:
            loads = f"loads from {ckpt[1]}" if ckpt[1] else "passes no --load" if recipe.train_args else \
                "may load from anywhere (the recipe has no captured flags)"
            raise ConfigError(f"--resume-from {resumed_from}: the upstream launcher {recipe.launcher} {loads}, not "
                              f"from {resuming.checkpoint_dir} where run {resumed_from} saved: it would not continue "
                              "those checkpoints", hint="use --mode direct (it passes --load "
                                                        f"{resuming.checkpoint_dir})")
    mode = "rehearse" if request.rehearse else request.mode
    warnings = unkept_checkpoints(cfg, target.backend, run, ckpt[0], output_dir)
    supervision = None
    if mode == "direct" and replaces is None:
        supervision, note = supervision_of(request, supervisor_kind(target.address),
                                           target.supervisors, ckpt[0])
        warnings = (*warnings, *note)
        if supervision is not None:
            resume_argv = direct_argv(cfg, recipe, plan, output_dir, run_id, request.extra_args,
                                      num_rollout=request.num_rollout, load_dir=ckpt[0])
            supervision["resume_job"] = {"entrypoint": shlex.join(resume_argv), "runtime_env": runtime_env}
            supervision.update(gpu_workers=plan.ray.gpu_workers, gpus_per_node=plan.gpus_per_node,
                               workers_timeout=max(600.0, request.timeout))
    controller = None if supervision is None else Controller.model_validate(
        {k: supervision[k] for k in ("kind", "max_restarts", "keep_checkpoints", "keep_best") if k in supervision})
    typed = RunRecord(
        schema=SCHEMA, run=run, cluster=cfg.name, backend=target.backend, address=target.address, submission_id=sid,
        mode=mode, created=created, image=str(image) if image else None,
        image_digest=image.digest if image else None, ray_version=cfg.ray_version, miles_commit=request.miles_commit,
        model_revision=request.model_revision, dataset_revision=request.dataset_revision, recipe=recipe.name,
        recipe_hash=recipe.content_hash(), recipe_spec=recipe.model_dump(mode="json"),
        split=plan.model_dump(mode="json", include=_RECORDED_SPLIT), output_dir=output_dir,
        resumed_from=resumed_from, entrypoint=entrypoint, checkpoint_dir=ckpt[0], load_dir=ckpt[1],
        checkpoint_dirs_from=ckpt_from, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig,
        supervisor=controller, memory_check="skipped (--no-memory-check)" if request.no_memory_check else None)
    # the prepared record (dry runs print it): every field but those set on creation, and the supervisor and the
    # memory check only when there are
    record = typed.model_dump(by_alias=True, exclude=set(RECORDED_ON_CREATION) | (
        {"supervisor"} if controller is None else set()) | (set() if request.no_memory_check else {"memory_check"}))
    if existing is not None:
        refuse_changed_request(run, existing, record)
    metadata = {"miles_ray_run": run, "recipe": recipe.name, "recipe_hash": recipe.content_hash(),
                "cluster": cfg.name, "mode": mode, "layout": plan.layout,
                "image_digest": typed.image_digest or "", "output_dir": output_dir}
    kind: Literal["ray-job", "launcher-exec", "launcher-polyaxon"] = "ray-job"
    operation = None
    if mode == "launcher":
        kind = "launcher-polyaxon" if head.kind == "kubernetes" else "launcher-exec"
        if kind == "launcher-polyaxon":
            operation = launcher_job_operation(cfg, recipe, plan, typed.image, run, output_dir, in_cluster,
                                               request.extra_args, run_id=run_id, head_auth=target.head_auth)
    # Data and checkpoint preflight on every node: default on for Kubernetes clusters, where the shared volume is
    # real (--check-data / --no-check-data override). Rehearsals touch no data.
    check_data = not request.rehearse and (request.check_data if request.check_data is not None
                                          else target.backend == "kuberay")
    return SubmitJob(kind=kind, run=run, submission_id=sid, address=target.address, in_cluster_address=in_cluster,
                     entrypoint=entrypoint, runtime_env=runtime_env, metadata=metadata, record=record,
                     output_dir=output_dir, resumed_from=resumed_from, plan=plan, recipe=recipe,
                     check_data=check_data, resume=resuming,
                     wait_for_nodes=request.wait_for_nodes, timeout=request.timeout, launcher_argv=argv,
                     operation=operation, existing=existing, reconcile_error=reconcile_error, warnings=warnings,
                     attempt=attempt, replaces=replaces,
                     supervision=None if supervision is None else {
                         **supervision, "resume_job": {**supervision["resume_job"], "metadata": metadata}})


def supervision_of(request: SubmitRequest, kind: str, available: frozenset[str],
                   save: str | None) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Whether a direct-mode run is supervised, and a notice when the default does not apply: (``{kind,
    max_restarts, checkpoint_dir}`` or None, notes). --max-restarts N > 0 where no supervisor can run, or for a job
    that saves no checkpoints (a new attempt would start over in its output dir), is bad input."""
    n = request.max_restarts
    explicit = n is not None
    n = DEFAULT_MAX_RESTARTS if n is None else n
    retention = {k: v for k, v in (("keep_checkpoints", request.keep_checkpoints), ("keep_best", request.keep_best))
                 if v is not None}
    if n == 0:
        return None, ()
    explicit = explicit or bool(retention)  # a retention needs the supervisor: no silent fallback
    if kind not in available:
        if explicit:
            raise ConfigError(f"--max-restarts {n}: a run supervisor on a {kind} cluster is not available in this "
                              "miles-ray", hint="pass --max-restarts 0 (not supervised)")
        return None, ()
    if not save:
        if explicit:
            raise ConfigError(f"--max-restarts {n}: the job saves no checkpoints (no --save), so a restarted attempt "
                              "would start over in its output dir", hint="pass --extra-args '--save DIR', or "
                                                                         "--max-restarts 0")
        return None, ("the job saves no checkpoints (no --save): not supervised (a restarted attempt would start "
                      "over)",)
    return {"kind": kind, "max_restarts": n, "checkpoint_dir": save, **retention}, ()


def unkept_checkpoints(cfg: MilesRayConfig, backend: str, run: str, save: str | None,
                       output_dir: str) -> tuple[str, ...]:
    """A warning when a job on a cluster miles-ray made (KubeRay or Polyaxon) saves its checkpoints outside the
    shared volume: there the only volume on head and workers is the claim at ``mount_path``, so a ``--save``
    elsewhere (e.g. the LoRA launcher's ``/personal/checkpoints/<run>``) lands in a pod's own filesystem and is
    lost with the pod. Nothing to say on the local backend (one filesystem) or for a head of unknown volumes."""
    if backend != "kuberay" or not save:
        return ()
    if PurePosixPath(posixpath.normpath(save)).is_relative_to(posixpath.normpath(cfg.mount_path)):
        return ()
    keep = f"{output_dir}/checkpoints"
    return (f"run {run} saves its checkpoints to {save}, outside the shared volume miles-ray mounts on head and "
            f"workers ({cfg.claim} at {cfg.mount_path}): unless the pods mount another volume there, they stay in one "
            "pod's own filesystem and are lost with the pod, and --resume-from and register cannot find them; to keep "
            f"them pass --extra-args '--save {keep}'",)
