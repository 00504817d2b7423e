"""Submitting Miles to an existing Ray head, and the job commands (status, logs, stop, runs)."""

from __future__ import annotations

import datetime as _dt
import os
from contextlib import AbstractContextManager, contextmanager
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from miles_ray.adapters import state
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.entrypoint import (RUN_NAME, default_run_name, direct_entrypoint, job_env, launcher_argv,
                                       rehearsal_entrypoint, submission_id)
from miles_ray.core.errors import ClusterError, ConfigError, Interrupted, PlanError
from miles_ray.core.planner import Plan, summary_line
from miles_ray.core.recipes import Recipe, get_recipe
from miles_ray.core.runs import SCHEMA, RunRecord, resume_differences
from miles_ray.core.secrets import HINT as SECRET_HINT
from miles_ray.core.secrets import secret_name, secret_value

Progress = Callable[[str], None] | None

def launchers_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("miles_ray.launchers")))


def parse_env(items: list[str]) -> dict[str, str]:
    """--env KEY=VALUE pairs. A secret-looking name or value is refused: it would land in plain text
    in the job's runtime env, metadata and run record. The refusal never repeats the value."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
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


@contextmanager
def reach(address: str, kube_context: str | None = None, kubeconfig: str | None = None) -> Iterator[str]:
    """An http URL for a stored address. ``k8s://NAMESPACE/RAYCLUSTER`` (a head outside this machine's
    network) opens a port-forward to the head pod's 8265 through the Kubernetes API for the duration."""
    if not address.startswith("k8s://"):
        yield address
        return
    from miles_ray.adapters import kube

    namespace, _, name = address[len("k8s://"):].partition("/")
    api = kube.load_client(kubeconfig, kube_context)
    with kube.port_forward(api, namespace, kube.head_pod(api, namespace, name)) as url:
        yield url


def reach_record(record: dict[str, Any], kube_context: str | None = None,
                 kubeconfig: str | None = None) -> AbstractContextManager[str]:
    """:func:`reach` for a run record: --context/--kubeconfig given now win over the context recorded at submit."""
    return reach(record["address"], kube_context or record.get("kube_context"), kubeconfig)


def in_cluster_url(address: str) -> str:
    """What processes inside the cluster use to reach the head (the job's and the launcher's RAY_ADDRESS)."""
    if address.startswith("k8s://"):
        namespace, _, name = address[len("k8s://"):].partition("/")
        return f"http://{name}-head-svc.{namespace}.svc:8265"
    return address


def resolve_address(cfg: MilesRayConfig, address: str | None, backend: str = "auto") -> tuple[str, str]:
    """(backend, address): --address, then $RAY_ADDRESS, then the config, then the cluster made by up
    (which may be ``k8s://NS/NAME``: see :func:`reach`)."""
    from miles_ray.services.clusters import dashboard_address

    for candidate, source in ((address, "--address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
                              (cfg.ray_address, "ray_address")):
        if candidate:
            if not re.match(r"^https?://", candidate):
                raise ConfigError(f"{source} {candidate!r} is not a dashboard URL",
                                  hint="use the Ray dashboard / Jobs API URL, e.g. http://HEAD:8265 (not the GCS port 6379)")
            return "address", candidate.rstrip("/")
    return dashboard_address(cfg, backend)


def job_or_none(address: str, job_id: str) -> dict | None:
    """The job's info, or None when the head has no job of that id."""
    from miles_ray.adapters import ray_jobs

    try:
        return ray_jobs.status(address, job_id)
    except ClusterError as e:
        if "no such job" in str(e) or "no job" in str(e):
            return None
        raise


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
           backend: str, wait_for_nodes: bool, timeout: float, env: dict[str, str], extra_args: list[str],
           resume_from: str | None, force: bool, miles_commit: str | None, model_revision: str | None,
           dataset_revision: str | None, num_rollout: int | None, progress: Progress = None,
           python: str | None = None, check_data: bool | None = None) -> dict[str, Any]:
    """Validate everything, check the live cluster, write the run record, submit. Returns a summary."""
    from miles_ray.core.images import check_image
    from miles_ray.core.planner import plan_split

    recipe: Recipe = get_recipe(cfg.recipe, cfg.recipe_file)
    plan = plan_split(recipe, cfg.nodes, cfg.gpus_per_node, cfg.layout, cfg.rollout_nodes, cfg.rollout_gpus)
    if not plan.feasible:
        raise PlanError(summary_line(plan), violations=plan.errors)
    if mode == "launcher":
        if not plan.colocate:
            raise ConfigError("--mode launcher runs the upstream launcher, which is always colocated; this plan is "
                              f"{plan.layout}", hint="use --mode direct for disaggregated splits")
        if recipe.launcher_max_nodes and plan.nodes > recipe.launcher_max_nodes:
            raise ConfigError(f"the upstream launcher {recipe.launcher} supports at most {recipe.launcher_max_nodes} "
                              f"node(s)", hint="use --mode direct")
    image_ref = None
    if cfg.image:
        image_ref, _ = check_image(cfg.image, cfg.allow_unpinned)
    if run is not None and not RUN_NAME.match(run):
        raise ConfigError(f"run name {run!r} is not valid",
                          hint="use lower-case letters, digits and '-', at most 40 characters")

    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and re.search(r"(key|token|secret|password|passwd|credentials?)$", flag, re.I):
            raise ConfigError(f"--extra-args passes {flag}: a credential on the job's command line would be stored "
                              "in the run record and the job's entrypoint", hint=SECRET_HINT)
        what = secret_value(arg)
        if what:
            raise ConfigError(f"--extra-args contains what looks like {what}; it would be stored in the run record "
                              "and the job's entrypoint", hint=SECRET_HINT)
    chosen_backend, stored = resolve_address(cfg, address, backend)
    if mode == "launcher" and stored.startswith("k8s://") and image_ref is None:
        raise ConfigError("--mode launcher on a Kubernetes cluster runs the launcher as a Polyaxon job in the Miles "
                          "image: an image is needed", hint="pass --image repo@sha256:<64 hex>")
    try:
        with reach(stored, cfg.kube_context, cfg.kubeconfig) as url:
            return _submit_reachable(cfg, recipe, plan, image_ref, chosen_backend, stored, url, run=run, mode=mode,
                                     rehearse=rehearse, wait_for_nodes=wait_for_nodes, timeout=timeout, env=env,
                                     extra_args=extra_args, resume_from=resume_from, force=force,
                                     miles_commit=miles_commit, model_revision=model_revision,
                                     dataset_revision=dataset_revision, num_rollout=num_rollout, progress=progress,
                                     python=python, check_data=check_data)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while submitting run {run or '(unnamed)'}; no new run record was kept",
                          hint="run the same 'miles-ray submit --run NAME' again: it finds the job if Ray had "
                               "accepted it, or submits it once (the job id is derived from the run name)") from None


def _submit_reachable(cfg, recipe, plan, image_ref, chosen_backend, stored, url, *, run, mode, rehearse,
                      wait_for_nodes, timeout, env, extra_args, resume_from, force, miles_commit, model_revision,
                      dataset_revision, num_rollout, progress, python, check_data=None) -> dict[str, Any]:
    from miles_ray.adapters import ray_jobs

    created = _now()
    run = run or default_run_name(recipe, plan, created)
    sid = submission_id(cfg.name, run)

    # An existing record for this run: the same job (idempotent) or a reconcile of an interrupted submit.
    existing = state.read_json(state.record_path(run))
    if existing is not None:
        if existing.get("address") != stored:
            raise ConfigError(f"run {run!r} already exists on another cluster ({existing.get('address')})",
                              hint="pick another --run name")
        job = job_or_none(url, existing["submission_id"])
        if job is not None:
            return {"run": run, "submission_id": existing["submission_id"], "created": False, "address": stored,
                    "status": job["status"], "record": str(state.record_path(run)),
                    "output_dir": existing["output_dir"]}
        if existing.get("recipe_hash") != recipe.content_hash() or resume_differences(
                RunRecord.model_validate(existing), recipe.content_hash(), plan.model_dump()):
            raise ConfigError(f"run {run!r} was recorded with a different recipe or split and has no job",
                              hint="pick another --run name")

    resumed_from = None
    output_dir = cfg.output_dir(run)
    if resume_from:
        prev = _find_resume(resume_from)
        diffs = resume_differences(RunRecord.model_validate(prev), recipe.content_hash(), plan.model_dump())
        if diffs and not force:
            raise ConfigError(f"--resume-from {prev['run']}: checkpoints were written with a different setup: "
                              + "; ".join(diffs), hint="pass --force to reuse them anyway")
        output_dir, resumed_from = prev["output_dir"], prev["run"]

    topology = ray_jobs.cluster_topology(url)
    problems = check_topology(topology, plan)
    if problems and wait_for_nodes:
        topology = ray_jobs.wait_for_gpu_nodes(url, plan.ray.gpu_workers, plan.gpus_per_node, timeout, progress)
        problems = check_topology(topology, plan)
    if problems:
        raise ClusterError(f"the cluster at {url} does not fit the plan: " + "; ".join(problems),
                           hint="add GPU workers ('miles-ray scale'), wait for them (--wait-for-nodes), "
                                "or plan for what is there")
    # Data and checkpoint preflight on every node (default on for Kubernetes clusters, where the shared volume
    # is real; --check-data / --no-check-data override). Rehearsals touch no data.
    if not rehearse and (check_data if check_data is not None else chosen_backend == "kuberay"):
        from miles_ray.services.datacheck import check_data as run_check

        report = run_check(cfg, url, recipe, output_dir if resumed_from else None, python=python, progress=progress)
        if not report.get("ok"):
            missing = report.get("missing") or []
            raise ClusterError(f"data preflight failed on the cluster ({len(missing)} problem(s)): "
                               + "; ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""),
                               hint="'miles-ray check-data' lists every missing path per node")
    live_version = ray_jobs.ray_version(url)
    ray_version = live_version or cfg.ray_version
    if cfg.ray_version and live_version and cfg.ray_version != live_version:
        raise ClusterError(f"the cluster runs Ray {live_version} but the config says {cfg.ray_version}",
                           hint="head, workers and submitter must run one Ray version: fix --ray-version or the image")

    runtime_env: dict[str, Any] = {"env_vars": job_env(cfg, in_cluster_url(stored), env)}
    if rehearse:
        py = python or "python3"
        entrypoint = rehearsal_entrypoint("rehearse.py", plan, max(10, min(timeout, 600)))
        entrypoint = entrypoint.replace("python3", py, 1) if py != "python3" else entrypoint
        runtime_env["working_dir"] = str(launchers_dir())
    elif mode == "direct":
        entrypoint = direct_entrypoint(cfg, recipe, plan, output_dir, extra_args, num_rollout=num_rollout)
    else:
        entrypoint = " ".join(launcher_argv(cfg, recipe, plan, output_dir, run, extra_args))
    record = RunRecord(
        schema=SCHEMA, run=run, cluster=cfg.name, backend=chosen_backend, address=stored, submission_id=sid,
        mode="rehearse" if rehearse else mode, created=created, image=str(image_ref) if image_ref else None,
        image_digest=image_ref.digest if image_ref else None, ray_version=ray_version, miles_commit=miles_commit,
        model_revision=model_revision, dataset_revision=dataset_revision, recipe=recipe.name,
        recipe_hash=recipe.content_hash(), recipe_spec=recipe.model_dump(mode="json"),
        split=plan.model_dump(mode="json", include={"layout", "nodes", "gpus_per_node", "actor_num_nodes",
                                                      "trainer_gpus", "rollout_num_gpus",
                                                      "rollout_num_gpus_per_engine", "miles_args", "colocate"}),
        output_dir=output_dir, resumed_from=resumed_from, entrypoint=entrypoint, kube_context=cfg.kube_context,
    ).model_dump(by_alias=True)
    if mode == "launcher" and not rehearse:
        if stored.startswith("k8s://"):
            return launcher_as_polyaxon_job(cfg, recipe, plan, record, extra_args)
        return {"run": run, "record": record, "address": in_cluster_url(stored), "launcher": True}
    owns_record = False
    if existing is None:
        try:
            state.create_record(record) if not resumed_from else state.save_record(record)
            owns_record = True
        except ConfigError:
            # A concurrent submit of this same run wrote the record first: same job id, so Ray keeps one job.
            other = state.read_json(state.record_path(run))
            if not other or (other.get("address"), other.get("submission_id"), other.get("recipe_hash")) != (
                    record["address"], record["submission_id"], record["recipe_hash"]):
                raise
    metadata = {"miles_ray_run": run, "recipe": recipe.name, "recipe_hash": recipe.content_hash(),
                "cluster": cfg.name, "mode": record["mode"], "layout": plan.layout,
                "image_digest": record["image_digest"] or "", "output_dir": output_dir}
    try:
        job_id, created_now = ray_jobs.submit(url, entrypoint, runtime_env, sid, metadata,
                                              entrypoint_num_cpus=None)
    except BaseException:
        if owns_record:
            state.record_path(run).unlink(missing_ok=True)
        raise
    return {"run": run, "submission_id": job_id, "created": created_now, "address": stored,
            "record": str(state.record_path(run)), "output_dir": output_dir, "entrypoint": entrypoint,
            "status": ray_jobs.status(url, job_id)["status"]}


def launcher_as_polyaxon_job(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, record: dict[str, Any],
                              extra_args: list[str]) -> dict[str, Any]:
    """--mode launcher on a Kubernetes cluster: the upstream launcher runs as a Polyaxon job in the same image and
    connection, inside the cluster, against the head service (never nested in a Ray job, never next to us)."""
    from miles_ray.adapters import polyaxon_api, polyaxon_spec
    from miles_ray.core.entrypoint import launcher_job_operation

    head_url = in_cluster_url(record["address"])
    op = launcher_job_operation(cfg, recipe, plan, record["image"], record["run"], record["output_dir"], head_url,
                                extra_args)
    polyaxon_spec.validate_operation(op)
    state.create_record(record)
    try:
        uuid = polyaxon_api.PolyaxonApi(host=cfg.polyaxon_host).create_operation(
            cfg.polyaxon_owner, cfg.polyaxon_project, op, name=op["name"], tags=op["tags"],
            meta={"miles_ray_run": record["run"], "recipe_hash": record["recipe_hash"]})
    except BaseException:
        state.record_path(record["run"]).unlink(missing_ok=True)
        raise
    record["polyaxon_run_uuid"] = uuid
    state.save_record(record)
    return {"run": record["run"], "polyaxon_uuid": uuid, "created": True, "address": record["address"],
            "record": str(state.record_path(record["run"])), "output_dir": record["output_dir"],
            "submission_id": f"polyaxon:{uuid}", "status": "CREATED", "launcher_job": True}


def live_status(record: dict[str, Any], kube_context: str | None = None, kubeconfig: str | None = None) -> str:
    try:
        with reach_record(record, kube_context, kubeconfig) as url:
            job = job_or_none(url, record["submission_id"])
    except ClusterError:
        return "UNREACHABLE"
    return job["status"] if job else "UNKNOWN"


def run_status(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
    from miles_ray.adapters import ray_jobs

    rec = state.load_record(run)
    with reach_record(rec, kube_context, kubeconfig) as url:
        info = ray_jobs.status(url, rec["submission_id"])
    info.pop("runtime_env", None)
    return {"run": run, "submission_id": rec["submission_id"], "address": rec["address"], **info,
            "output_dir": rec["output_dir"], "recipe": rec["recipe"], "mode": rec["mode"]}


def run_logs(run: str, follow: bool, kube_context: str | None = None,
             kubeconfig: str | None = None) -> Iterator[str]:
    from miles_ray.adapters import ray_jobs

    rec = state.load_record(run)
    with reach_record(rec, kube_context, kubeconfig) as url:
        if follow:
            yield from ray_jobs.follow_logs(url, rec["submission_id"])
        else:
            yield ray_jobs.logs(url, rec["submission_id"])


def run_stop(run: str, kube_context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
    from miles_ray.adapters import ray_jobs

    rec = state.load_record(run)
    with reach_record(rec, kube_context, kubeconfig) as url:
        stopped = ray_jobs.stop(url, rec["submission_id"])
    return {"run": run, "submission_id": rec["submission_id"], "stopped": stopped}


def latest_run() -> str:
    records = state.list_records()
    if not records:
        raise ConfigError("no runs yet", hint="submit one with 'miles-ray submit'")
    return records[-1]["run"]


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
