"""Submitting Miles to an existing Ray head, and the job commands (status, logs, stop, runs).

``submit`` prepares first, then executes: :func:`miles_ray.core.submission.validate_request` and
:func:`~miles_ray.core.submission.prepare_submit` build the complete job without I/O; only then is the head
reached (:func:`miles_ray.adapters.ray_head.open_head`), its live topology compared with the plan, the data
preflight run on every node (a probe), the run recorded and the job submitted.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

from miles_ray.adapters import kube, polyaxon_api, polyaxon_spec, ray_auth, ray_jobs, state
from miles_ray.adapters.ray_head import kube_head_auth, local_token_path, open_head
from miles_ray.core import miles_version
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import RUN_NAME, job_env
from miles_ray.core.errors import ClusterError, ConfigError, Interrupted, NotFound, TimedOut
from miles_ray.core.submission import (SubmitJob, SubmitRequest, SubmitTarget, check_topology, parse_env,
                                       prepare_submit, validate_request)
from miles_ray.services import saved_runs
from miles_ray.services.check_data import check_data as run_data_check
from miles_ray.core.heads import parse_head
from miles_ray.services.heads import recorded_head_auth, resolve_address
from miles_ray.services.miles_version import check_image_miles
from miles_ray.services.probes import launchers_dir, payload_python
from miles_ray.core.progress import Progress


# parse_env (the --env rules submit applies) is part of this service's surface, with the job commands below.
__all__ = ["dry_run_view", "exec_launcher", "job_or_none", "latest_run", "launcher_as_polyaxon_job", "launcher_env",
           "live_status",
           "parse_env", "run_logs", "run_status", "run_stop", "submit"]


def job_or_none(url: str, job_id: str) -> dict | None:
    """The job's info, or None when the head has no job of that id."""
    try:
        return ray_jobs.status(url, job_id)
    except NotFound:
        return None


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


def submit(cfg: MilesRayConfig, *, run: str | None, mode: str, rehearse: bool, address: str | None,
           backend: str, wait_for_nodes: bool, timeout: float, env: list[str], extra_args: list[str],
           resume_from: str | None, force: bool, miles_commit: str | None, model_revision: str | None,
           dataset_revision: str | None, num_rollout: int | None, progress: Progress = None,
           check_data: bool | None = None, dry_run: str | None = None, hold: float = 0,
           allow_miles_drift: bool = False) -> dict[str, Any]:
    """Prepare the job (no I/O), then reach the head, check it against the plan, record the run and submit.
    ``env``: the --env KEY=VALUE items as given. Returns a summary.

    Direct mode reads the Miles commit in the image first (a probe on a GPU worker) and refuses a job whose
    catalog mirrors another Miles unless ``allow_miles_drift`` (:mod:`miles_ray.core.miles_version`).

    ``dry_run``: ``client`` returns the prepared job (entrypoint, runtime env, submission id, run record, output
    dir) and contacts nothing; ``server`` also compares the head's live topology and Ray version with the plan.
    Neither writes a record or submits anything."""
    request = SubmitRequest(run=run, mode=mode, rehearse=rehearse, env=list(env), extra_args=list(extra_args),
                            resume_from=resume_from, force=force, miles_commit=miles_commit,
                            model_revision=model_revision, dataset_revision=dataset_revision,
                            num_rollout=num_rollout, timeout=timeout, wait_for_nodes=wait_for_nodes,
                            check_data=check_data, hold=hold)
    valid = validate_request(cfg, request)  # bad input fails here, before anything is looked up
    miles_version.validate_asserted(miles_commit)
    if allow_miles_drift and (rehearse or mode != "direct"):
        raise ConfigError("--allow-miles-drift applies to --mode direct: a rehearsal runs no Miles, and the launcher "
                          "is the image's own (exact by construction)", hint="drop --allow-miles-drift")
    chosen_backend, stored = resolve_address(cfg, address, backend)
    target = SubmitTarget(backend=chosen_backend, address=stored, python=payload_python(stored),
                          head_auth=recorded_head_auth(cfg, stored) if mode == "launcher" else None)
    existing = state.read_json(state.record_path(run)) if run and RUN_NAME.fullmatch(run) else None
    job = prepare_submit(cfg, valid, target, created=_now(), launchers_dir=str(launchers_dir()), existing=existing,
                         resume=_find_resume(resume_from) if resume_from else None, environ=os.environ)
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
        result = launcher_as_polyaxon_job(cfg, job.record, job.operation or {})
        env = (job.operation or {}).get("component", {}).get("run", {}).get("container", {}).get("env", [])
        ref = next((e["valueFrom"]["secretKeyRef"]["name"] for e in env if e["name"] == "RAY_AUTH_TOKEN"), None)
        token = (f", the Ray token Secret {cfg.namespace}/{ref} the job reads (taken from this machine's record of "
                 "the cluster; a pod without it stays in CreateContainerConfigError)" if ref else "")
        result["warnings"] = list(job.warnings)
        result["notices"] = [f"no kubeconfig ({missing} does not exist): the checks of the head before the launcher "
                             f"job (live topology against the plan, data preflight, Ray version{token}) are skipped; "
                             "the launcher itself fails if the head does not fit"]
        return result
    try:
        if dry_run == "server":
            with open_head(job.address, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
                live = ray_jobs.cluster_topology(url)
                return {**dry_run_view(job.with_head_ray_version(cfg, ray_jobs.ray_version(url)), "server"),
                        "problems": check_topology(live, job.plan), "topology": live}
        with open_head(job.address, kube_context=cfg.kube_context, kubeconfig=cfg.kubeconfig) as url:
            return {**_execute(cfg, job, url, progress, allow_miles_drift), "warnings": list(job.warnings)}
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while submitting run {job.run}; no new run record was kept",
                          hint="run the same 'miles-ray submit --run NAME' again: it finds the job if Ray had "
                               "accepted it, or submits it once (the job id is derived from the run name)") from None


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


def dry_run_view(job: SubmitJob, mode: str) -> dict[str, Any]:
    """What submit would do, in full: the job's entrypoint and runtime env at the top level (as Ray gets them)."""
    view: dict[str, Any] = {
        "dry_run": mode, "created": False, "run": job.run, "kind": job.kind, "submission_id": job.submission_id,
        "address": job.address, "entrypoint": job.entrypoint, "runtime_env": job.runtime_env,
        "metadata": job.metadata, "output_dir": job.output_dir, "record": job.record,
        "check_data": job.check_data, "resumed_from": job.resumed_from, "warnings": list(job.warnings),
    }
    if job.launcher_argv is not None:
        view["launcher_argv"] = job.launcher_argv
    if job.operation is not None:
        view["operation"] = job.operation
    if job.existing is not None:
        view["existing_run"] = {"submission_id": job.existing.get("submission_id"),
                                "output_dir": job.existing.get("output_dir")}
    return view


def _execute(cfg: MilesRayConfig, job: SubmitJob, url: str, progress: Progress,
             allow_miles_drift: bool = False) -> dict[str, Any]:
    """The I/O of submit, in order: an existing job of this run is returned as is; the live cluster must fit the
    plan (waiting for nodes if asked); direct mode: the Miles commit in the image vs the catalog's; the data
    preflight; the head's Ray version; the record; the job."""
    if job.existing is not None:
        found = job_or_none(url, job.existing["submission_id"])
        if found is not None:
            return {"run": job.run, "submission_id": job.existing["submission_id"], "created": False,
                    "address": job.address, "status": found["status"], "record": str(state.record_path(job.run)),
                    "output_dir": job.existing["output_dir"]}
        if job.reconcile_error is not None:
            raise job.reconcile_error

    topology = ray_jobs.cluster_topology(url)
    problems = check_topology(topology, job.plan)
    if problems and job.wait_for_nodes:
        topology = ray_jobs.wait_for_gpu_nodes(url, job.plan.ray.gpu_workers, job.plan.gpus_per_node, job.timeout,
                                               progress)
        problems = check_topology(topology, job.plan)
    if problems:
        raise ClusterError(f"the cluster at {url} does not fit the plan: " + "; ".join(problems),
                           hint="add GPU workers ('miles-ray scale'), wait for them (--wait-for-nodes), "
                                "or plan for what is there")
    version = None
    if job.kind == "ray-job" and job.record["mode"] == "direct":
        version, _ = check_image_miles(cfg, url, payload_python(job.address), asserted=job.record.get("miles_commit"),
                                       allow_drift=allow_miles_drift, progress=progress)
        job = replace(job, record={**job.record, "miles_commit": version.image, "miles_version": version.record()})
    if job.check_data:
        report = run_data_check(cfg, url, job.recipe, job.resume, python=payload_python(job.address),
                                progress=progress)
        if not report.ok:
            missing = report.missing
            raise ClusterError(f"data preflight failed on the cluster ({len(missing)} problem(s)): "
                               + "; ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""),
                               hint="'miles-ray check-data' lists every missing path per node")
    job = job.with_head_ray_version(cfg, ray_jobs.ray_version(url))

    if job.kind == "launcher-polyaxon":
        return launcher_as_polyaxon_job(cfg, job.record, job.operation or {})
    if job.kind == "launcher-exec":
        return {"run": job.run, "record": job.record, "address": job.in_cluster_address, "launcher": True}
    owns_record = False
    if job.existing is None:
        try:
            state.create_record(job.record) if not job.resumed_from else state.save_record(job.record)
            owns_record = True
        except ConfigError:
            # A concurrent submit of this same run wrote the record first: same job id, so Ray keeps one job.
            other = state.read_json(state.record_path(job.run))
            if not other or (other.get("address"), other.get("submission_id"), other.get("recipe_hash")) != (
                    job.record["address"], job.record["submission_id"], job.record["recipe_hash"]):
                raise
    try:
        job_id, created_now = ray_jobs.submit(url, job.entrypoint, job.runtime_env, job.submission_id, job.metadata)
    except BaseException:
        if owns_record:
            state.record_path(job.run).unlink(missing_ok=True)
        raise
    out = {"run": job.run, "submission_id": job_id, "created": created_now, "address": job.address,
           "record": str(state.record_path(job.run)), "output_dir": job.output_dir, "entrypoint": job.entrypoint,
           "status": ray_jobs.status(url, job_id)["status"]}
    if version is not None:
        out["miles_version"] = version.record()
        out["miles_notice"] = miles_version.notice(version, cfg.miles_root)
    return out


def launcher_as_polyaxon_job(cfg: MilesRayConfig, record: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    """--mode launcher on a Kubernetes cluster: the upstream launcher runs as a Polyaxon job in the same image and
    connection, inside the cluster, against the head service (never nested in a Ray job, never next to us).
    ``operation`` is the prepared job (:func:`miles_ray.core.entrypoint.launcher_job_operation`)."""
    polyaxon_spec.validate_operation(operation)
    record = {**record, "polyaxon_owner": cfg.polyaxon_owner, "polyaxon_project": cfg.polyaxon_project}
    state.create_record(record)
    try:
        uuid = polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host).create_operation(
            cfg.polyaxon_owner, cfg.polyaxon_project, operation, name=operation["name"], tags=operation["tags"],
            meta={"miles_ray_run": record["run"], "recipe_hash": record["recipe_hash"]})
    except BaseException:
        state.record_path(record["run"]).unlink(missing_ok=True)
        raise
    record = {**record, "polyaxon_run_uuid": uuid}
    state.save_record(record)
    return {"run": record["run"], "polyaxon_uuid": uuid, "created": True, "address": record["address"],
            "record": str(state.record_path(record["run"])), "output_dir": record["output_dir"],
            "submission_id": f"polyaxon:{uuid}", "status": "CREATED", "launcher_job": True}


# -- the job of a recorded run ----------------------------------------------------------------------

# Polyaxon run statuses as Ray job states (what status/logs/stop report for a launcher job)
_PX_STATES = {"succeeded": "SUCCEEDED", "done": "SUCCEEDED", "failed": "FAILED", "upstream_failed": "FAILED",
              "stopped": "STOPPED", "skipped": "STOPPED", "running": "RUNNING"}
LOGS_POLL = 2.0


def _polyaxon_job(rec: dict[str, Any]):
    """(client, owner, project, uuid) of a run whose job is a Polyaxon job (``--mode launcher`` on Kubernetes);
    None for a Ray job. Polyaxon's host: ``POLYAXON_HOST`` (as when it was submitted)."""
    uuid = rec.get("polyaxon_run_uuid")
    if not uuid or rec.get("mode") != "launcher":
        return None
    if not rec.get("polyaxon_project"):
        raise ConfigError(f"run {rec['run']!r}: its record does not say which Polyaxon project holds job {uuid}",
                          hint="read it with 'polyaxon ops logs --uid " + uuid + "'")
    return polyaxon_api.PolyaxonApi(), rec.get("polyaxon_owner") or "default", rec["polyaxon_project"], uuid


def _polyaxon_state(run: dict[str, Any]) -> str:
    return _PX_STATES.get(run.get("status") or "", "PENDING")


def _open_run_head(rec: dict[str, Any], kube_context: str | None, kubeconfig: str | None):
    """The head of a recorded run (``kube_context``/``kubeconfig`` override what the record kept)."""
    return open_head(rec["address"], kube_context=kube_context or rec.get("kube_context"),
                     kubeconfig=kubeconfig or rec.get("kubeconfig"))


def live_status(record: dict[str, Any], kube_context: str | None = None, kubeconfig: str | None = None) -> str:
    """The run's job state, ``UNREACHABLE`` when its head does not answer, ``UNKNOWN`` when it has no such job."""
    try:
        px = _polyaxon_job(record)
        if px is not None:
            client, owner, project, uuid = px
            return _polyaxon_state(client.get_run(owner, project, uuid, with_conditions=False))
    except NotFound:
        return "UNKNOWN"
    except (ClusterError, ConfigError):
        return "UNREACHABLE"
    try:
        with _open_run_head(record, kube_context, kubeconfig) as url:
            job = job_or_none(url, record["submission_id"])
    except ClusterError:
        return "UNREACHABLE"
    return job["status"] if job else "UNKNOWN"


def run_status(run: str, *, kube_context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
    """The run's job info from its head; once the head (or its job) is gone, from the saved copy (``saved_copy``
    then says where and when it was saved). A job seen ended is saved."""
    rec = state.load_record(run)
    px = _polyaxon_job(rec)
    if px is not None:  # the launcher runs as a Polyaxon job: Polyaxon says how it is doing
        client, owner, project, uuid = px
        info = client.get_run(owner, project, uuid, with_conditions=True)
        last = (info.get("conditions") or [{}])[-1]
        return {"run": run, "submission_id": f"polyaxon:{uuid}", "address": rec["address"],
                "status": _polyaxon_state(info), "polyaxon_status": info.get("status"), "polyaxon_uuid": uuid,
                "message": " ".join((last.get("message") or "").split()) or None,
                "output_dir": rec["output_dir"], "recipe": rec["recipe"], "mode": rec["mode"]}
    try:
        with _open_run_head(rec, kube_context, kubeconfig) as url:
            info = ray_jobs.status(url, rec["submission_id"])
            saved_runs.save_if_ended(rec, url, info)
    except ClusterError:
        info = saved_runs.saved_status(rec)
        if info is None:
            raise
    info.pop("runtime_env", None)
    return {"run": run, "submission_id": rec["submission_id"], "address": rec["address"], **info,
            "output_dir": rec["output_dir"], "recipe": rec["recipe"], "mode": rec["mode"]}


def run_logs(run: str, follow: bool, *, kube_context: str | None = None, kubeconfig: str | None = None,
             on_saved_copy: Callable[[dict[str, Any]], None] | None = None) -> Iterator[str]:
    """The job's driver logs from its head (followed until the job ends: then they are saved); once the head (or
    its job) is gone, the saved copy, after calling ``on_saved_copy`` with where and when it was saved."""
    rec = state.load_record(run)
    px = _polyaxon_job(rec)
    if px is not None:
        yield from _polyaxon_logs(*px, follow)
        return
    yielded = False
    try:
        with _open_run_head(rec, kube_context, kubeconfig) as url:
            if follow:
                for chunk in ray_jobs.follow_logs(url, rec["submission_id"]):
                    yielded = True
                    yield chunk
                saved_runs.save_if_ended(rec, url, ray_jobs.status(url, rec["submission_id"]))
            else:
                text = ray_jobs.logs(url, rec["submission_id"])
                yielded = True
                yield text
    except ClusterError:
        saved = None if yielded else saved_runs.saved_logs(rec)
        if saved is None:
            raise
        if on_saved_copy:
            on_saved_copy(saved[1])
        yield saved[0]


def _polyaxon_logs(client, owner: str, project: str, uuid: str, follow: bool) -> Iterator[str]:
    """A Polyaxon job's logs through Polyaxon; following, new lines until the run has ended (then one last
    read, so nothing archived at the end is missed)."""
    seen = 0
    while True:
        ended = follow and client.get_run(owner, project, uuid, with_conditions=False).get("status") in \
            polyaxon_api.FINAL_STATUSES
        lines = [str(x.get("value", "")) for x in client.get_logs(owner, project, uuid)]
        if len(lines) > seen:
            yield "".join(line + "\n" for line in lines[seen:])
            seen = len(lines)
        if not follow or ended:
            return
        time.sleep(LOGS_POLL)


def run_stop(run: str, *, kube_context: str | None = None, kubeconfig: str | None = None,
             wait_timeout: float | None = 60) -> dict[str, Any]:
    """Ask Ray to stop the run's job, then (unless ``wait_timeout`` is None) wait until it has ended, like
    ``ray job stop``: a stop returns once the job no longer holds its GPUs. ``TimedOut`` names its state."""
    rec = state.load_record(run)
    px = _polyaxon_job(rec)
    if px is not None:
        client, owner, project, uuid = px
        client.stop_run(owner, project, uuid)
        return {"run": run, "submission_id": rec["submission_id"], "stopped": True,
                "status": _polyaxon_state(client.get_run(owner, project, uuid, with_conditions=False))}
    with _open_run_head(rec, kube_context, kubeconfig) as url:
        stopped = ray_jobs.stop(url, rec["submission_id"])
        status = None
        if wait_timeout is not None:
            try:
                info = ray_jobs.wait(url, rec["submission_id"], timeout=wait_timeout)
                status = info["status"]
                saved_runs.save_if_ended(rec, url, info)
            except TimedOut as e:
                raise TimedOut(f"run {run}: stop requested, but {e}",
                               hint=f"'miles-ray status {run}' shows when it has ended") from None
    return {"run": run, "submission_id": rec["submission_id"], "stopped": stopped, "status": status}


def latest_run() -> str:
    records = state.list_records()
    if not records:
        raise ConfigError("no runs yet", hint="submit one with 'miles-ray submit'")
    return records[-1]["run"]


def launcher_env(cfg: MilesRayConfig, address: str) -> dict[str, str]:
    """The upstream launcher's environment on this machine: the job's, plus Ray token auth so the ``ray``
    commands it runs are let in: ``RAY_AUTH_MODE=token`` with the local cluster's token file
    (``RAY_AUTH_TOKEN_PATH``), or with the ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH`` it inherits. By path or
    inherited only: the token itself is never added."""
    env = job_env(cfg, address)
    token_path = local_token_path(address)
    if token_path:
        env.update({ray_auth.MODE_ENV: "token", ray_auth.TOKEN_PATH_ENV: token_path})
    elif ray_auth.token_from_env():
        env[ray_auth.MODE_ENV] = "token"
    return env


def exec_launcher(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """Replace this process with the upstream launcher (never a child of miles-ray: the launcher
    pkill -9s processes named miles, sglang and redis on this host)."""
    full_env = {**os.environ, **env}
    try:
        os.chdir(cwd)
    except OSError as e:
        raise ConfigError(f"Miles checkout {cwd} is not here ({e.strerror})",
                          hint="run --mode launcher where the Miles checkout lives (e.g. in the Miles image), "
                               "or set miles_root") from None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, full_env)
