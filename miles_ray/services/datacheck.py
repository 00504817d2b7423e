"""Data and checkpoint preflight on a live Ray cluster: what the Miles launcher will read and write, checked
from the head and every alive GPU worker node by a short Ray job (``launchers/check_data.py``).

``check_data`` is what ``miles-ray check-data`` and ``miles-ray doctor`` call (and submit can call before
it submits). It returns a report; it raises only when the check itself could not run.
"""

from __future__ import annotations

import json
import uuid
from pathlib import PurePosixPath
from typing import Any, Callable

from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ClusterError, ConfigError
from miles_ray.core.recipes import Recipe

Progress = Callable[[str], None] | None
RESULT_PREFIX = "CHECK_DATA_RESULT "
SPEC_ENV = "CHECK_DATA_SPEC"
DRIVER = "check_data.py"


def build_spec(cfg: MilesRayConfig, recipe: Recipe, resume_output_dir: str | None = None, timeout: float = 60,
               test_mount_paths: dict[str, str] | None = None) -> dict[str, Any]:
    """The payload's spec: every path it checks, as the launcher will see them."""
    model_dir, data_dir = PurePosixPath(cfg.model_dir), PurePosixPath(cfg.data_dir)
    inputs = [
        ("HF model (SGLang, tokenizer)", str(model_dir / recipe.hf_dir)),
        ("Megatron checkpoint (--ref-load)", str(model_dir / recipe.megatron_dir)),
        ("training data", str(data_dir / recipe.train_data)),
    ]
    if recipe.eval_data:
        inputs.append(("evaluation data", str(data_dir / recipe.eval_data)))
    output_parent = str(PurePosixPath(cfg.mount_path) / cfg.runs_dir)
    tracker = None
    if resume_output_dir:
        tracker = str(PurePosixPath(resume_output_dir) / "checkpoints" / "latest_checkpointed_iteration.txt")
        output_parent = str(PurePosixPath(resume_output_dir).parent)
    spec: dict[str, Any] = {"mount_path": cfg.mount_path, "inputs": inputs, "output_parent": output_parent,
                            "tracker": tracker, "timeout": timeout}
    if test_mount_paths:
        spec["test_mount_paths"] = dict(test_mount_paths)
    return spec


def resume_dir(cfg: MilesRayConfig, resume_from: str | None) -> str | None:
    """--resume-from RUN|DIR -> the output dir whose checkpoints a resumed run would load."""
    if not resume_from:
        return None
    if "/" in resume_from:
        p = PurePosixPath(resume_from)
        if not p.is_absolute():
            raise ConfigError(f"--resume-from {resume_from}: an output dir must be an absolute path")
        return str(p)
    from miles_ray.adapters import state

    return state.load_record(resume_from)["output_dir"]


def parse_result(logs: str) -> dict[str, Any] | None:
    for line in reversed(logs.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                return None
    return None


def check_data(cfg: MilesRayConfig, address: str, recipe: Recipe, resume_output_dir: str | None = None, *,
               timeout: float = 60, python: str | None = None, test_mount_paths: dict[str, str] | None = None,
               progress: Progress = None) -> dict[str, Any]:
    """Run the preflight job on the cluster at ``address`` (dashboard URL). Returns the report:
    ``ok``, ``nodes`` (per node: checks with evidence, ``missing``), ``missing`` (every problem, one line
    each, per node), ``same_storage``, ``job``. ClusterError when the job cannot run or gives no result."""
    from miles_ray.adapters import ray_jobs
    from miles_ray.services.jobs import launchers_dir

    spec = build_spec(cfg, recipe, resume_output_dir, timeout, test_mount_paths)
    job_id = f"miles-ray-check-data-{cfg.name}-{uuid.uuid4().hex[:8]}"
    runtime_env = {"working_dir": str(launchers_dir()), "env_vars": {SPEC_ENV: json.dumps(spec)}}
    entrypoint = f"{python or 'python3'} {DRIVER}"
    if progress:
        progress(f"checking {cfg.mount_path} on every node of {address} (job {job_id})")
    job_id, _ = ray_jobs.submit(address, entrypoint, runtime_env, job_id,
                                {"miles_ray": "check-data", "cluster": cfg.name})
    # four bounded rounds of per-node tasks, plus job start-up (runtime env upload, driver start)
    info = ray_jobs.wait(address, job_id, timeout=4 * timeout + 120)
    logs = ray_jobs.logs(address, job_id)
    result = parse_result(logs)
    if result is None:
        tail = " | ".join(line for line in logs.strip().splitlines()[-3:]) or "no output"
        raise ClusterError(f"the check-data job {job_id} ended {info['status']} without a result: {tail[:400]}",
                           hint=f"'ray job logs {job_id}' on the head shows everything")
    missing = [f"{n['node_ip']} ({n['role']}): {m['what']} {m['path']}: {m['problem']}".replace(" : ", ": ")
               for n in result["nodes"] for m in n.get("missing", [])]
    if not result["nodes"]:
        missing.append("no alive head or GPU worker node answered")
    return {"address": address, "job": job_id, "recipe": recipe.name, "mount_path": cfg.mount_path,
            "resume_output_dir": resume_output_dir, "ok": result["ok"] and not missing, "missing": missing,
            "nodes": result["nodes"], "same_storage": result["same_storage"], "seconds": result.get("seconds")}
