"""The "prepare" step of ``submit``: from the configuration and the request to the complete job -- entrypoint,
runtime env, submission id, metadata, run record, output dir (or, for ``--mode launcher``, the launcher command
or its Polyaxon operation) -- before anything talks to a cluster. Pure: it receives what it needs (config,
request, the resolved head address, the records it may reuse, the time) and returns data or raises a typed
error; ``miles_ray.services.runs.submit.submit`` then does the I/O.

Two steps, so that bad input fails before any I/O (even before the head address is looked up):
:func:`validate_request` (config and flags alone) and :func:`prepare_submit` (with the head address). The checks
against the live cluster (:func:`check_topology`, :func:`check_head_ray_version`) are pure verdicts on what the
service read from the head after preparing.
"""

from __future__ import annotations

import copy
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from miles_ray.core.builders import ray_auth_env
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import (RUN_NAME, checkpoint_dirs, default_run_name, direct_argv, direct_job_env,
                                       filled_train_args, job_env, launcher_argv, launcher_job_operation,
                                       rehearsal_entrypoint, submission_id)
from miles_ray.core.errors import ConfigError, Conflict
from miles_ray.core.heads import in_cluster_url, parse_head
from miles_ray.core.images import ImageRef, check_image
from miles_ray.core.planner import Plan
from miles_ray.core.prepare import require_feasible, resolve_plan
from miles_ray.core.recipes import Recipe
from miles_ray.core.runs import (RECORDED_ON_CREATION, SCHEMA, ResumeTarget, RunRecord, attempt_submission_id,
                                 head_identity, new_attempt, resume_differences, resume_target, run_id_of)
from miles_ray.core.secrets import HINT as SECRET_HINT
from miles_ray.core.secrets import secret_name, secret_value
from miles_ray.core.supervision import DEFAULT_MAX_RESTARTS, MAX_RESTARTS_LIMIT, SPEC_SCHEMA

REHEARSAL_DRIVER = "rehearse.py"
_CREDENTIAL_FLAG = re.compile(r"(key|token|secret|password|passwd|credentials?)$", re.I)
_RECORDED_SPLIT = {"layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
                   "rollout_num_gpus_per_engine", "miles_args", "colocate"}


def parse_env(items: list[str]) -> dict[str, str]:
    """--env KEY=VALUE pairs. A secret-looking name or value is refused: it would land in plain text
    in the job's runtime env, metadata and run record. The refusal never repeats the value."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ConfigError(f"--env {item!r} is not KEY=VALUE with a valid variable name")
        if secret_name(key):
            raise ConfigError(
                f"--env {key}=... looks like a credential; miles-ray does not put secrets in plain text into job "
                "specs or run records", hint="supply it through a Kubernetes Secret or a scoped Polyaxon connection")
        what = secret_value(value)
        if what:
            raise ConfigError(f"--env {key}=... looks like {what}; miles-ray does not put secrets in plain text into "
                              "job specs or run records", hint=SECRET_HINT)
        out[key] = value
    return out


def split_extra_args(text: str | None) -> list[str]:
    """--extra-args as the shell would split it; an unbalanced quote is bad input (exit 2), said in one line."""
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as e:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(f"--extra-args {text!r} cannot be split into arguments ({str(e).lower()})",
                          hint="balance its quotes, e.g. --extra-args '--lr 1e-6 --note \"two words\"'") from None


def check_extra_args(extra_args: list[str]) -> None:
    """Refuse credentials in --extra-args: they would be stored in the run record and the job's entrypoint."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and _CREDENTIAL_FLAG.search(flag):
            raise ConfigError(f"--extra-args passes {flag}: a credential on the job's command line would be stored "
                              "in the run record and the job's entrypoint", hint=SECRET_HINT)
        what = secret_value(arg)
        if what:
            raise ConfigError(f"--extra-args contains what looks like {what}; it would be stored in the run record "
                              "and the job's entrypoint", hint=SECRET_HINT)


@dataclass(frozen=True)
class SubmitRequest:
    """What the user asked ``submit`` for (flags other than the configuration's)."""

    run: str | None = None
    mode: Literal["direct", "launcher"] = "direct"
    rehearse: bool = False
    env: list[str] = field(default_factory=list)  # KEY=VALUE, as given
    extra_args: list[str] = field(default_factory=list)
    resume_from: str | None = None
    force: bool = False
    miles_commit: str | None = None
    model_revision: str | None = None
    dataset_revision: str | None = None
    num_rollout: int | None = None
    timeout: float = 120.0  # waiting for nodes; the rehearsal's placement timeout
    wait_for_nodes: bool = False
    check_data: bool | None = None  # None: on for Kubernetes clusters
    hold: float = 0  # rehearsal: seconds to keep the placed actors, failing if one dies
    # neither --nodes nor --gpus-per-node given: plan for the live cluster's GPU workers (not in a client dry run)
    shape_from_cluster: bool = False
    # restarts of a supervised run (None: the default, 3 where a supervisor can run and the job saves checkpoints;
    # 0: not supervised)
    max_restarts: int | None = None


@dataclass(frozen=True)
class ValidRequest:
    """A request that passed every check that needs no cluster: its recipe, plan, pinned image and env."""

    request: SubmitRequest
    recipe: Recipe
    plan: Plan
    image: ImageRef | None
    env: dict[str, str]


def validate_request(cfg: MilesRayConfig, request: SubmitRequest) -> ValidRequest:
    """Every check of config and flags alone (exit 2 on bad input): the split is feasible, the mode fits it,
    the image is pinned, the run name is valid, no credential in --env or --extra-args."""
    recipe, plan = resolve_plan(cfg)
    require_feasible(plan)
    if request.mode == "launcher":
        check_launcher_layout(recipe, plan)
        if recipe.launcher_max_nodes and plan.nodes > recipe.launcher_max_nodes:
            raise ConfigError(f"the upstream launcher {recipe.launcher} supports at most {recipe.launcher_max_nodes} "
                              f"node(s)", hint="use --mode direct")
        if recipe.launcher_min_nodes and plan.nodes < recipe.launcher_min_nodes:
            raise ConfigError(f"the upstream launcher {recipe.launcher} submits this recipe's layout from "
                              f"{recipe.launcher_min_nodes} nodes on (on fewer it refuses, runs a debug layout or asks for its own node count)",
                              hint="use --mode direct")
    if request.mode == "direct" and not request.rehearse and not recipe.train_args:
        raise ConfigError(f"recipe {recipe.name!r} has no train_args: direct mode builds train.py's command line from "
                          "them", hint="add model_args and train_args to the recipe (docs/recipes.md), or use "
                                       "--mode launcher")
    image = check_image(cfg.image, cfg.allow_unpinned)[0] if cfg.image else None
    if request.run is not None and not RUN_NAME.fullmatch(request.run):
        raise ConfigError(f"run name {request.run!r} is not valid",
                          hint="use lower-case letters, digits and '-', at most 40 characters")
    check_extra_args(request.extra_args)
    if request.hold and not request.rehearse:
        raise ConfigError("--hold keeps a rehearsal's actors in place; it applies to --rehearse only",
                          hint="add --rehearse, or drop --hold")
    check_max_restarts(request)
    return ValidRequest(request=request, recipe=recipe, plan=plan, image=image, env=parse_env(request.env))


def check_max_restarts(request: SubmitRequest) -> None:
    """--max-restarts: 0..MAX_RESTARTS_LIMIT, for a direct-mode run (a rehearsal writes no checkpoints to resume
    from; the upstream launcher decides where it loads from)."""
    n = request.max_restarts
    if n is None:
        return
    if n < 0 or n > MAX_RESTARTS_LIMIT:
        raise ConfigError(f"--max-restarts {n} is out of range", hint=f"give 0 (not supervised) to "
                                                                      f"{MAX_RESTARTS_LIMIT}; the default is "
                                                                      f"{DEFAULT_MAX_RESTARTS}")
    if request.rehearse:
        raise ConfigError("--max-restarts means nothing with --rehearse (a rehearsal is never restarted)",
                          hint="drop --max-restarts")
    if request.mode == "launcher" and n > 0:
        raise ConfigError("--max-restarts applies to --mode direct: the upstream launcher decides where it loads "
                          "checkpoints from, so a supervisor cannot resume it", hint="use --mode direct, or drop "
                                                                                     "--max-restarts")


def supervisor_kind(backend: str, address: str) -> str:
    """Where a run's supervisor lives: ``polyaxon`` (inside the Polyaxon run of a Polyaxon-made cluster),
    ``kubernetes`` (a Kubernetes Job beside a KubeRay head), ``local`` (a detached process on this machine)."""
    if backend == "polyaxon":
        return "polyaxon"
    return "kubernetes" if parse_head(address).kind == "kubernetes" else "local"


def check_launcher_layout(recipe: Recipe, plan: Plan) -> None:
    """--mode launcher runs the recipe's upstream launcher, which submits its own layout: the recipe's
    ``default_layout`` (the catalog's are checked against the captures of the launchers), and a disaggregated
    launcher its own split (``default_actor_nodes`` trainer nodes, ``default_rollout_gpus`` rollout GPUs) whatever
    --num-nodes says. A plan of another layout or split is refused: the launcher would not run it."""
    want = recipe.default_layout
    if plan.layout != want:
        raise ConfigError(f"--mode launcher runs the upstream launcher {recipe.launcher}, which runs recipe "
                          f"{recipe.name} {want}; this plan is {plan.layout}",
                          hint=f"use --mode direct for a {plan.layout} split, or plan --layout {want}")
    if want == "disaggregated" and (plan.actor_num_nodes, plan.rollout_num_gpus) != (
            recipe.default_actor_nodes, recipe.default_rollout_gpus):
        need = (recipe.default_actor_nodes or 0) + -(-(recipe.default_rollout_gpus or 0) // plan.gpus_per_node)
        raise ConfigError(f"--mode launcher runs the upstream launcher {recipe.launcher}, which runs recipe "
                          f"{recipe.name} disaggregated on its own split ({recipe.default_actor_nodes} trainer "
                          f"node(s), {recipe.default_rollout_gpus} rollout GPUs) whatever --num-nodes says; this "
                          f"plan is {plan.actor_num_nodes} trainer node(s), {plan.rollout_num_gpus} rollout GPUs",
                          hint=f"use --mode direct for this split, or plan the launcher's: --nodes {need} --layout "
                               f"disaggregated --rollout-gpus {recipe.default_rollout_gpus}")


@dataclass(frozen=True)
class SubmitTarget:
    """Where the job goes: the backend that made the head (local, kuberay, polyaxon, address), the head's
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
    attempt = len((replaces or {}).get("attempts") or [None]) + 1 if replaces is not None else 1
    sid = attempt_submission_id(submission_id(cfg.name, run), attempt)
    if replaces is not None:
        created = replaces.get("created") or created

    reconcile_error = None
    if existing is not None and existing.get("address") != target.address:
        raise ConfigError(f"run {run!r} already exists on another cluster ({existing.get('address')})",
                          hint="pick another --run name")

    output_dir, resumed_from, resuming = cfg.output_dir(run), None, None
    if resume is not None:
        diffs = resume_differences(RunRecord.model_validate(resume), recipe.content_hash(), plan.model_dump())
        if diffs and not request.force:
            raise ConfigError(f"--resume-from {resume['run']}: checkpoints were written with a different setup: "
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
        supervision, note = supervision_of(request, supervisor_kind(target.backend, target.address),
                                           target.supervisors, ckpt[0])
        warnings = (*warnings, *note)
        if supervision is not None:
            resume_argv = direct_argv(cfg, recipe, plan, output_dir, run_id, request.extra_args,
                                      num_rollout=request.num_rollout, load_dir=ckpt[0])
            supervision["resume_job"] = {"entrypoint": shlex.join(resume_argv), "runtime_env": runtime_env}
            supervision.update(gpu_workers=plan.ray.gpu_workers, gpus_per_node=plan.gpus_per_node,
                               workers_timeout=max(600.0, request.timeout))
    record = RunRecord(
        schema=SCHEMA, run=run, cluster=cfg.name, backend=target.backend, address=target.address, submission_id=sid,
        mode=mode, created=created, image=str(image) if image else None,
        image_digest=image.digest if image else None, ray_version=cfg.ray_version, miles_commit=request.miles_commit,
        model_revision=request.model_revision, dataset_revision=request.dataset_revision, recipe=recipe.name,
        recipe_hash=recipe.content_hash(), recipe_spec=recipe.model_dump(mode="json"),
        split=plan.model_dump(mode="json", include=_RECORDED_SPLIT), output_dir=output_dir,
        resumed_from=resumed_from, entrypoint=entrypoint, checkpoint_dir=ckpt[0], load_dir=ckpt[1],
        checkpoint_dirs_from=ckpt_from, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig,
    ).model_dump(by_alias=True, exclude=set(RECORDED_ON_CREATION) | {"supervisor"})
    if supervision is not None:
        record["supervisor"] = {"kind": supervision["kind"], "max_restarts": supervision["max_restarts"]}
    if existing is not None:
        refuse_changed_request(run, existing, record)
    metadata = {"miles_ray_run": run, "recipe": recipe.name, "recipe_hash": recipe.content_hash(),
                "cluster": cfg.name, "mode": mode, "layout": plan.layout,
                "image_digest": record["image_digest"] or "", "output_dir": output_dir}
    kind: Literal["ray-job", "launcher-exec", "launcher-polyaxon"] = "ray-job"
    operation = None
    if mode == "launcher":
        kind = "launcher-polyaxon" if head.kind == "kubernetes" else "launcher-exec"
        if kind == "launcher-polyaxon":
            operation = launcher_job_operation(cfg, recipe, plan, record["image"], run, output_dir, in_cluster,
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
    if n == 0:
        return None, ()
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
    return {"kind": kind, "max_restarts": n, "checkpoint_dir": save}, ()


# what a run's record keeps of its request, compared when the same run name is submitted again
_REQUEST_FIELDS = ("recipe", "recipe_hash", "mode", "image", "model_revision", "dataset_revision", "resumed_from",
                   "entrypoint")


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value."""
    return [a for i, a in enumerate(argv) if a != flag and (i == 0 or argv[i - 1] != flag)]


def _self_resumed(record: Mapping[str, Any]) -> bool:
    """An attempt after the first (a job lost with its head): it resumes from the run's own checkpoints."""
    return bool(record.get("run")) and record.get("resumed_from") == record.get("run")


def _request_entrypoint(record: Mapping[str, Any], attempt_resume: bool = False) -> Any:
    """The entrypoint as a request: a rehearsal's ``--timeout`` (how long it waits for its placement, from submit's
    --timeout) is how long to wait, not what to run, so re-running the same submit with another --timeout finds
    the same run; a later attempt's ``--load`` of the run's own checkpoints (``attempt_resume``) is the attempt's,
    not the user's request."""
    entrypoint = record.get("entrypoint")
    if not isinstance(entrypoint, str) or not (record.get("mode") == "rehearse" or attempt_resume):
        return entrypoint
    argv = shlex.split(entrypoint)
    if record.get("mode") == "rehearse":
        argv = _drop_flag(argv, "--timeout")
    if attempt_resume:
        argv = _drop_flag(argv, "--load")
    return argv


def request_differences(existing: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    """How the run ``record`` about to be made differs from the ``existing`` record of that run name, field by
    field (empty: the same request, a re-submit)."""
    diffs: list[str] = []
    attempt_resume = _self_resumed(existing)  # the run's later attempt: compare with the request it continues
    for key in _REQUEST_FIELDS:
        if key == "recipe_hash" and existing.get("recipe") != record.get("recipe"):
            continue  # a different recipe says it already
        if key == "resumed_from" and attempt_resume:
            continue
        if key == "entrypoint" and diffs:
            continue  # the entrypoint follows from the fields above
        old, new = existing.get(key), record.get(key)
        if key == "entrypoint":
            old, new = _request_entrypoint(existing, attempt_resume), _request_entrypoint(record, attempt_resume)
        if old != new:
            if key == "recipe_hash":
                old, new = str(old)[:19], str(new)[:19]
            if key == "entrypoint":
                diffs.append("the job's command line (--extra-args, --num-rollout or a setting it is built from)")
            else:
                diffs.append(f"{key} {old} != {new}")
    old_split, new_split = existing.get("split") or {}, record.get("split") or {}
    for key in new_split:
        if key != "miles_args" and key in old_split and old_split[key] != new_split[key]:  # (older records lack some)
            diffs.append(f"{key} {old_split.get(key)} != {new_split.get(key)}")
    return diffs


def refuse_changed_request(run: str, existing: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """A run name is one request: submitting it again with the same request finds its job (a no-op); with another
    request it is refused (exit 2), naming what differs."""
    diffs = request_differences(existing, record)
    if diffs:
        raise ConfigError(f"run {run!r} already exists with a different request: " + "; ".join(diffs),
                          hint=f"submit it under a new --run name, or continue its checkpoints with a new --run name "
                               f"and --resume-from {run}")


def unkept_checkpoints(cfg: MilesRayConfig, backend: str, run: str, save: str | None,
                       output_dir: str) -> tuple[str, ...]:
    """A warning when a job on a cluster miles-ray made (KubeRay or Polyaxon) saves its checkpoints outside the
    shared volume: there the only volume on head and workers is the claim at ``mount_path``, so a ``--save``
    elsewhere (e.g. the LoRA launcher's ``/personal/checkpoints/<run>``) lands in a pod's own filesystem and is
    lost with the pod. Nothing to say on the local backend (one filesystem) or for a head of unknown volumes."""
    if backend not in ("kuberay", "polyaxon") or not save:
        return ()
    if PurePosixPath(posixpath.normpath(save)).is_relative_to(posixpath.normpath(cfg.mount_path)):
        return ()
    keep = f"{output_dir}/checkpoints"
    return (f"run {run} saves its checkpoints to {save}, outside the shared volume miles-ray mounts on head and "
            f"workers ({cfg.claim} at {cfg.mount_path}): unless the pods mount another volume there, they stay in one "
            "pod's own filesystem and are lost with the pod, and --resume-from and register cannot find them; to keep "
            f"them pass --extra-args '--save {keep}'",)


def check_topology(topology: dict, plan: Plan) -> list[str]:
    """What the live cluster lacks for the plan (empty: enough). Compares GPU worker nodes and GPUs/node.
    ``topology['nodes']`` lists the ALIVE nodes only."""
    gpu_nodes = [n for n in topology["nodes"] if n["gpus"] > 0]
    problems: list[str] = []
    per_node = sorted({int(n["gpus"]) for n in gpu_nodes})
    gpu_nodes = [n for n in gpu_nodes if int(n["gpus"]) >= plan.gpus_per_node] if len(per_node) > 1 else gpu_nodes
    if len(gpu_nodes) < plan.ray.gpu_workers:
        problems.append(f"{len(gpu_nodes)} GPU node(s) alive, the plan needs {plan.ray.gpu_workers} "
                        f"(missing {plan.ray.gpu_workers - len(gpu_nodes)})")
    wrong = [n for n in gpu_nodes if int(n["gpus"]) != plan.gpus_per_node]
    if wrong:
        problems.append(f"GPU nodes advertise {per_node} GPUs each, the plan needs exactly {plan.gpus_per_node} per node "
                        "(--gpus-per-node must be the real per-node count, or engines get the wrong host)")
    few_cpus = [n for n in gpu_nodes if n["cpus"] < plan.gpus_per_node]
    if few_cpus:
        problems.append(f"{len(few_cpus)} GPU node(s) advertise fewer CPUs than GPUs ({plan.gpus_per_node}); "
                        "Miles needs one CPU with every GPU bundle")
    spare = sum(n["cpus"] for n in topology["nodes"]) - plan.trainer_gpus - (
        0 if plan.colocate else plan.rollout_num_gpus)
    if not problems and spare < plan.ray.spare_cpus:  # a missing node explains a CPU shortfall already
        problems.append("no spare CPU for the RolloutManager (one CPU outside the GPU bundles)")
    return problems


def live_shape(topology: dict) -> tuple[int, int] | None:
    """The live cluster's shape as ``--nodes``/``--gpus-per-node`` would say it: its alive GPU workers and the
    GPUs of each (the most common count when they differ); None without a GPU worker."""
    per_node = [int(n["gpus"]) for n in topology["nodes"] if n["gpus"] > 0]
    if not per_node:
        return None
    gpus = max(sorted(set(per_node)), key=per_node.count)
    return sum(1 for g in per_node if g >= gpus), gpus


def topology_fix(topology: dict, plan: Plan) -> str:
    """The flag (or verb) that makes the plan fit the live cluster, for a refusal's hint: ``--gpus-per-node G``
    when the cluster's nodes have another GPU count, ``--nodes N`` for fewer GPU workers than planned (or
    'scale' to add them, or waiting for them)."""
    shape = live_shape(topology)
    fixes = []
    if shape is not None and shape[1] != plan.gpus_per_node:
        fixes.append(f"pass --gpus-per-node {shape[1]} (what each GPU node has)")
    if shape is None or shape[0] < plan.ray.gpu_workers:
        fixes.append((f"plan for what is there (--nodes {shape[0]}), " if shape else "")
                     + f"add GPU workers ('miles-ray scale --nodes {plan.ray.gpu_workers}') or wait for them "
                       "(--wait-for-nodes)")
    return "; ".join(fixes) or "plan for what is there ('miles-ray status' shows it)"


def check_head_ray_version(configured: str | None, live: str | None) -> str | None:
    """The Ray version to record: the head's own, else the configured one. The head, workers and submitter must
    run one Ray version, so a configured version the head does not run is refused."""
    if configured and live and configured != live:
        raise Conflict(f"the cluster runs Ray {live} but the config says {configured}",
                       hint="head, workers and submitter must run one Ray version: fix --ray-version or the image")
    return live or configured
