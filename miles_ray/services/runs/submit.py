"""Submitting a run: prepare first, then execute. :func:`miles_ray.core.submission.validate_request` and
:func:`~miles_ray.core.submission.prepare_submit` build the complete job without I/O; only then is the head
reached (:func:`miles_ray.adapters.ray_head.open_head`), its live topology compared with the plan, the data
preflight run on every node (a probe), and the job handed to the backend that serves it
(:func:`miles_ray.services.runs.backend_for`), which records the run and creates the job.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import sys
from dataclasses import replace
from typing import Any, NoReturn, Union

from miles_ray.adapters import kube, ray_auth, ray_jobs, state
from miles_ray.adapters.ray_head import kube_head_auth, local_token_path, open_head, serving_pod
from miles_ray.core import miles_version
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import RUN_NAME, job_env
from miles_ray.core.errors import ClusterError, ConfigError, Interrupted, MemoryMisfit, MilesRayError, PlanError
from miles_ray.core.heads import parse_head
from miles_ray.core.memory import LabelledGpu
from miles_ray.core.progress import Progress, say
from miles_ray.core.records import Attempt as RecordedAttempt
from miles_ray.core.records import as_record
from miles_ray.core.runs import (DryRunView, ExistingJob, ExistingRunRef, JobSubmitted, LauncherCommand,
                                 LauncherExec, LauncherJobCreated, run_checkpoints)
from miles_ray.core.submission import (SubmitJob, SubmitRequest, SubmitTarget, ValidRequest, check_topology,
                                       live_shape, prepare_submit, topology_fix, validate_request)
from miles_ray.services.check_data import check_data as run_data_check
from miles_ray.services.heads import recorded_head_auth, resolve_address
from miles_ray.services.miles_version import check_image_miles
from miles_ray.services.node_gpus import memory_on_cluster
from miles_ray.services.probes import launchers_dir, payload_python, side_by_side
from miles_ray.services.runs import backend_for, polyaxon_tracked
from miles_ray.services.runs.polyaxon_job import launcher_as_polyaxon_job
from miles_ray.services.runs.ray_job import RayJob, job_or_none
from miles_ray.services.runs.supervised import SupervisedRun, supervisor_kinds

__all__ = ["SubmitResult", "dry_run_view", "exec_launcher", "launcher_as_polyaxon_job", "launcher_command", "submit"]

SubmitResult = Union[DryRunView, ExistingJob, JobSubmitted, LauncherJobCreated, LauncherExec]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _find_resume(target: str) -> dict[str, Any]:
    if "/" in target:
        rec = state.find_record_by_output_dir(target)
        if rec is None:
            raise ConfigError(f"--resume-from {target}: no run recorded with that output dir",
                              hint="'miles-ray runs' lists runs and their output dirs")
        return rec
    return state.load_record(target)


def submit(cfg: MilesRayConfig, request: SubmitRequest, *, address: str | None = None, backend: str = "auto",
           progress: Progress = None, dry_run: str | None = None, allow_miles_drift: bool = False) -> SubmitResult:
    """Prepare the job of ``request`` (no I/O), then reach the head, check it against the plan, record the run
    and submit. ``address``/``backend``: which head (:func:`miles_ray.services.heads.resolve_address`).

    ``request.shape_from_cluster`` (neither --nodes nor --gpus-per-node given): the split is planned for the live
    cluster's GPU workers and GPUs per node (read from the head first; not in a client dry run).

    Direct mode reads the Miles commit in the image first (a probe on a GPU worker) and refuses a job whose
    catalog mirrors another Miles unless ``allow_miles_drift`` (:mod:`miles_ray.core.miles_version`), and a
    cluster without the trainer entry point (``miles_root``/train.py) on that node (exit 2, nothing recorded).
    A run name submitted again with another request is refused (exit 2) before anything is contacted.

    ``dry_run``: ``client`` returns the prepared job (entrypoint, runtime env, submission id, run record, output
    dir) and contacts nothing; ``server`` also compares the head's live topology and Ray version with the plan.
    Neither writes a record or submits anything. A launcher to be run here (``LauncherExec``) has its run
    recorded: :func:`launcher_command` and :func:`exec_launcher` run it."""
    live_shape_applies = request.shape_from_cluster and dry_run != "client"
    try:
        valid = validate_request(cfg, request)  # bad input fails here, before anything is looked up
    except PlanError as e:
        # the split may fit the live cluster's shape, and on Kubernetes a misfit is told after what the GPU nodes'
        # labels say (their memory when none is configured, every part that does not fit in one line): both
        # checked again below
        labels_may_say = (isinstance(e, MemoryMisfit) and dry_run != "client"
                          and _labels_readable(cfg, address, backend))
        if not (live_shape_applies or labels_may_say):
            raise
        valid = None
    miles_version.validate_asserted(request.miles_commit)
    mode = request.mode
    if allow_miles_drift and (request.rehearse or mode != "direct"):
        raise ConfigError("--allow-miles-drift applies to --mode direct: a rehearsal runs no Miles, and the launcher "
                          "is the image's own (exact by construction)", hint="drop --allow-miles-drift")
    chosen_backend, stored = resolve_address(cfg, address, backend)
    # a head in a Kubernetes namespace is read through a port-forward: without a kubeconfig (a Polyaxon user's
    # launcher job) the configured shape is planned and the launcher checks the head itself
    reachable = parse_head(stored).namespace is None or not kube.missing_kubeconfig(cfg.kubeconfig)
    # the GPU nodes' labels say their memory: a misfit is refused with it, before anything is recorded
    labelled = memory_on_cluster(cfg, request, stored, progress) if dry_run != "client" and reachable else None
    planned = _plan_for_live_shape(cfg, request, stored, progress, labelled) if live_shape_applies and reachable \
        else None
    if planned is not None:
        cfg, valid = planned
    elif valid is None or labelled is not None:  # (a misfit put off above is raised here)
        valid = validate_request(cfg, request, labelled)
    target = SubmitTarget(backend=chosen_backend, address=stored, python=payload_python(stored),
                          head_auth=recorded_head_auth(cfg, stored) if mode == "launcher" else None,
                          supervisors=supervisor_kinds())
    run = request.run
    existing = state.read_json(state.record_path(run)) if run and RUN_NAME.fullmatch(run) else None
    recorded = existing
    # the run's cluster, its head now at another address (a local cluster started again on another port): the same
    # cluster if its head is not the one the run's job started on (then the job was lost: its next attempt)
    moved = bool(existing and existing.get("head") and existing.get("address") != stored
                 and existing.get("cluster") == cfg.name and existing.get("backend") == chosen_backend)
    if moved:
        existing = {**existing, "address": stored}
    job = prepare_submit(cfg, valid, target, created=_now(), launchers_dir=str(launchers_dir()), existing=existing,
                         resume=_find_resume(request.resume_from) if request.resume_from else None,
                         environ=os.environ)
    if dry_run == "client":
        return dry_run_view(job, "client")
    missing = kube.missing_kubeconfig(None) if job.kind == "launcher-polyaxon" and not cfg.kubeconfig else None
    if job.kind == "launcher-polyaxon" and not missing:
        # the head pod says which Secret its token is in (and whether it runs with token auth at all): the
        # launcher job references exactly that one, whatever the config or --address names
        job = job.with_head_auth(*_launcher_head_auth(cfg, job.address))
    if job.kind == "launcher-polyaxon":
        _refuse_token_across_namespaces(cfg, job)
    if missing and dry_run is None:
        # a Polyaxon user without kubectl: the launcher job is created through Polyaxon's API alone
        created = backend_for(job.record, cfg=cfg).submit(job)
        env = (job.operation or {}).get("component", {}).get("run", {}).get("container", {}).get("env", [])
        ref = next((e["valueFrom"]["secretKeyRef"]["name"] for e in env if e["name"] == "RAY_AUTH_TOKEN"), None)
        token = (f", the Ray token Secret {cfg.namespace}/{ref} the job reads (taken from this machine's record of "
                 "the cluster; a pod without it stays in CreateContainerConfigError)" if ref else "")
        created.warnings = list(job.warnings)
        created.notices = [f"no kubeconfig ({missing} does not exist): the checks of the head before the launcher "
                           f"job (live topology against the plan, data preflight, Ray version{token}) are skipped; "
                           "the launcher itself fails if the head does not fit"]
        return created
    try:
        if dry_run == "server":
            with open_head(job.address, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
                live = ray_jobs.cluster_topology(url)
                view = dry_run_view(job.with_head_ray_version(cfg, ray_jobs.ray_version(url)), "server")
                view.problems = check_topology(live, job.plan)
                view.topology = live
                return view
        with open_head(job.address, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
            if job.existing is not None and job.kind == "ray-job" and job.reconcile_error is None and not (
                    recorded or {}).get("supervisor"):  # a supervised run's supervisor starts its attempts
                prior = RayJob(recorded or job.existing, url=url)
                info = job_or_none(url, job.existing_record.submission_id)
                lost = prior.lost_on(url, info)
                if lost is None and moved:
                    raise ConfigError(f"run {run!r} already exists on another cluster ({recorded['address']})",
                                      hint="pick another --run name")
                if lost is not None:  # the same run, its job lost with its head: its next attempt
                    prior.refuse_if_running(url, info)  # never two drivers
                    job = _next_attempt(cfg, valid, target, job, lost)
            result = _execute(cfg, job, url, progress, allow_miles_drift)
            result.warnings = [*job.warnings, *result.warnings]
            return result
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while submitting run {job.run}; no new run record was kept",
                          hint="run the same 'miles-ray submit --run NAME' again: it finds the job if Ray had "
                               "accepted it, or submits it once (the job id is derived from the run name)") from None


def _labels_readable(cfg: MilesRayConfig, address: str | None, backend: str) -> bool:
    """The head is a RayCluster this machine can read the GPU nodes' labels of (a kubeconfig is there)."""
    try:
        stored = resolve_address(cfg, address, backend)[1]
    except MilesRayError:  # no head: the misfit is the first thing to say
        return False
    return parse_head(stored).namespace is not None and not kube.missing_kubeconfig(cfg.kubeconfig)


def _plan_for_live_shape(cfg: MilesRayConfig, request: SubmitRequest, stored: str, progress: Progress,
                         labelled: LabelledGpu | None) -> tuple[MilesRayConfig, ValidRequest] | None:
    """Neither --nodes nor --gpus-per-node given: the config with the live cluster's GPU workers and GPUs per
    node, and the request validated for it (with the GPU memory the nodes' ``labelled`` say; None: the head has
    no GPU worker to take a shape from)."""
    with open_head(stored, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
        shape = live_shape(ray_jobs.cluster_topology(url))
    if shape is None:
        return None
    nodes, gpus = shape
    say(progress, f"notice: planning for the live cluster, {nodes} GPU node(s) x {gpus} GPUs (no --nodes or "
                  "--gpus-per-node given)")
    live = cfg.model_copy(update={"nodes": nodes, "gpus_per_node": gpus})
    try:
        return live, validate_request(live, request, labelled)
    except PlanError as e:
        raise PlanError(f"{e.message} (planned for the live cluster: no --nodes or --gpus-per-node given)",
                        violations=e.violations,
                        hint=f"'miles-ray recipes --fits {nodes}x{gpus}' lists the recipes it can run") from None


def _next_attempt(cfg: MilesRayConfig, valid: ValidRequest, target: SubmitTarget, job: SubmitJob,
                  lost: RecordedAttempt) -> SubmitJob:
    """The next attempt of ``job``'s run, whose job was lost with its head (``lost``: that attempt): a new
    submission id, resuming from the run's checkpoints (direct mode; a rehearsal writes none and starts again).
    Refused where that is not safe: a launcher (the upstream launcher decides where it loads from), or a job that
    saves no checkpoints (it would start over in the same output dir)."""
    prior = dict(job.existing or {})
    run = prior["run"]
    why = f"run {run}'s job was lost with its head ({lost.reason})"
    if prior.get("mode") == "launcher":
        raise ConfigError(f"{why}; a launcher is not started again by itself (the upstream launcher decides where "
                          "it loads checkpoints from)", hint=f"start a new run from its checkpoints: 'miles-ray "
                                                             f"submit --run NEW-NAME --resume-from {run} ...'")
    resume = None
    if prior.get("mode") == "direct":
        if not run_checkpoints(prior).save:
            raise ConfigError(f"{why}; it saves no checkpoints, so a new attempt would start over in its output dir",
                              hint="submit it under a new --run name to start over")
        resume = prior
    nxt = prepare_submit(cfg, valid, target, created=_now(), launchers_dir=str(launchers_dir()), resume=resume,
                         environ=os.environ, replaces=prior)
    return replace(nxt, warnings=(*nxt.warnings, f"run {run}: attempt {lost.attempt or 1} was lost with its "
                                                 f"head ({lost.reason}); submitting attempt {nxt.attempt}"
                                                 + (f", resuming from {nxt.resume.checkpoint_dir}" if nxt.resume
                                                    else "")))


def _launcher_head_auth(cfg: MilesRayConfig, address: str) -> tuple[str, str | None]:
    mode, secret = kube_head_auth(address, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig)
    if mode == "token" and secret is None:
        raise ClusterError(f"the head of {address} runs with RAY_AUTH_MODE=token but its RAY_AUTH_TOKEN is a literal "
                           "value, not taken from a Secret: the launcher job can only get the token by reference",
                           hint="set RAY_AUTH_TOKEN from a Secret on the head's Ray container (KubeRay's authOptions "
                                "does), or use --mode direct")
    return mode, secret


def _refuse_token_across_namespaces(cfg: MilesRayConfig, job: SubmitJob) -> None:
    """The launcher job's pod runs in the namespace Polyaxon's agent creates it in (--namespace) and a pod reads
    Secrets of its own namespace only: a token Secret of a head in another namespace cannot reach it."""
    head = parse_head(job.address)
    env = job.operation["component"]["run"]["container"]["env"] if job.operation else []
    ref = next((e for e in env if e["name"] == "RAY_AUTH_TOKEN"), None)
    if ref is not None and head.namespace and head.namespace != cfg.namespace:
        secret = ref["valueFrom"]["secretKeyRef"]["name"]
        raise ConfigError(f"the launcher job runs in namespace {cfg.namespace} (--namespace) but the head's Ray "
                          f"token Secret is {head.namespace}/{secret}: a pod can only read Secrets of its own "
                          "namespace", hint=f"pass --namespace {head.namespace} (where Polyaxon's agent must run "
                                            "the job), or use --mode direct")


def dry_run_view(job: SubmitJob, mode: str) -> DryRunView:
    """What submit would do, in full: the job's entrypoint and runtime env at the top level (as Ray gets them)."""
    view = DryRunView(
        dry_run=mode, created=False, run=job.run, kind=job.kind, submission_id=job.submission_id,
        address=job.address, entrypoint=job.entrypoint, runtime_env=job.runtime_env, metadata=job.metadata,
        output_dir=job.output_dir, record=job.record, check_data=job.check_data, resumed_from=job.resumed_from,
        warnings=list(job.warnings))
    if job.launcher_argv is not None:
        view.launcher_argv = job.launcher_argv
    if job.operation is not None:
        view.operation = job.operation
    if job.existing is not None:
        view.existing_run = ExistingRunRef(submission_id=job.existing_record.submission_id,
                                           output_dir=job.existing_record.output_dir)
    return view


def _execute(cfg: MilesRayConfig, job: SubmitJob, url: str, progress: Progress,
             allow_miles_drift: bool = False) -> ExistingJob | JobSubmitted | LauncherJobCreated | LauncherExec:
    """The I/O of submit, in order: an existing job of this run is returned as is; the live cluster must fit the
    plan (waiting for nodes if asked); direct mode: the Miles commit in the image vs the catalog's; the data
    preflight; the head's Ray version; then the backend records the run and creates its job (a launcher to run
    here: its record only)."""
    if job.existing is not None and job.existing_record.supervisor:  # its supervisor submits its attempts
        supervised = SupervisedRun(job.existing, url=url)
        revived = supervised.revive()
        return ExistingJob(run=job.run, submission_id=job.existing_record.submission_id, created=False,
                           address=job.address, status=supervised.live_state(),
                           record=str(state.record_path(job.run)), output_dir=job.existing_record.output_dir,
                           warnings=[f"run {job.run}: its supervisor was not running; started it again (it adopts "
                                     "the running attempt, or carries the run on)"] if revived else [])
    if job.existing is not None:
        found = job_or_none(url, job.existing_record.submission_id)
        if found is not None:
            return ExistingJob(run=job.run, submission_id=job.existing_record.submission_id, created=False,
                               address=job.address, status=found.status, record=str(state.record_path(job.run)),
                               output_dir=job.existing_record.output_dir)
        if job.reconcile_error is not None:
            raise job.reconcile_error

    home = polyaxon_tracked.preflight(cfg, job, progress)  # the cluster's Polyaxon project, before any Ray job
    topology = ray_jobs.cluster_topology(url)
    problems = check_topology(topology, job.plan)
    started = _now()
    if problems and job.wait_for_nodes:
        topology = ray_jobs.wait_for_gpu_nodes(url, job.plan.ray.gpu_workers, job.plan.gpus_per_node, job.timeout,
                                               progress)
        problems = check_topology(topology, job.plan)
    if problems:
        raise ClusterError(f"the cluster at {url} does not fit the plan: " + "; ".join(problems),
                           hint=topology_fix(topology, job.plan))
    version = None
    python = payload_python(job.address)
    direct = job.kind == "ray-job" and job.run_record.mode == "direct"
    # the two probe jobs run side by side; a Miles refusal is still the error said first
    image_check, report = side_by_side(
        (lambda: check_image_miles(cfg, url, python, asserted=job.run_record.miles_commit,
                                   allow_drift=allow_miles_drift, progress=progress)) if direct else None,
        (lambda: run_data_check(cfg, url, job.recipe, job.resume, python=python,
                                progress=progress)) if job.check_data else None)
    if image_check is not None:
        version, answer = image_check
        if answer.entry_exists is False:  # the job would fail at once: refuse before anything is recorded
            raise ConfigError(f"direct mode runs {answer.entry}, which is not on the cluster ({answer.where}: no such "
                              "file)", hint="set miles_root to the Miles checkout in the image (the Miles image has "
                                            "/root/miles), or use the image that has it")
        job = replace(job, record={**job.record, "miles_commit": version.image, "miles_version": version.record()})
    if report is not None and not report.ok:
        missing = report.missing
        raise ClusterError(f"data preflight failed on the cluster ({len(missing)} problem(s)): "
                           + "; ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""),
                           hint="'miles-ray check-data' lists every missing path per node")
    job = job.with_head_ray_version(cfg, ray_jobs.ray_version(url))
    job = job.with_head((topology.get("head") or {}).get("node_id"), serving_pod(url), started)

    if job.kind == "launcher-exec":  # the upstream launcher replaces this process: only its record is written here
        state.create_record(job.record)
        return LauncherExec(run=job.run, record=job.record, address=job.in_cluster_address, launcher=True)
    if home is not None:  # a run on a Polyaxon-made cluster is a Polyaxon run (services/runs/polyaxon_tracked.py)
        job = polyaxon_tracked.track(job, home, progress)
    try:
        out = backend_for(job.record, url=url, cfg=cfg).submit(job)
    except BaseException:
        polyaxon_tracked.untrack(job.record)
        raise
    if version is not None:
        out.miles_version = version.record()
        out.miles_notice = miles_version.notice(version, cfg.miles_root)
    return out


def launcher_command(cfg: MilesRayConfig, launch: LauncherExec) -> LauncherCommand:
    """The upstream launcher of ``launch`` as run on this machine: its command line, and its environment: the
    job's, plus Ray token auth so the ``ray`` commands it runs are let in: ``RAY_AUTH_MODE=token`` with the local
    cluster's token file (``RAY_AUTH_TOKEN_PATH``), or with the ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` it
    inherits. By path or inherited only: the token itself is never added."""
    env = job_env(cfg, launch.address)
    token_path = local_token_path(launch.address)
    if token_path:
        env.update({ray_auth.MODE_ENV: "token", ray_auth.TOKEN_PATH_ENV: token_path})
    elif ray_auth.token_from_env():
        env[ray_auth.MODE_ENV] = "token"
    return LauncherCommand(argv=shlex.split(as_record(launch.record).entrypoint), env=env, cwd=cfg.miles_root)


def exec_launcher(command: LauncherCommand) -> NoReturn:
    """Replace this process with the upstream launcher (never a child of miles-ray: the launcher
    pkill -9s processes named miles, sglang and redis on this host)."""
    full_env = {**os.environ, **command.env}
    try:
        os.chdir(command.cwd)
    except OSError as e:
        raise ConfigError(f"Miles checkout {command.cwd} is not here ({e.strerror})",
                          hint="run --mode launcher where the Miles checkout lives (e.g. in the Miles image), "
                               "or set miles_root") from None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command.argv[0], command.argv, full_env)
