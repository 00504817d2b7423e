"""What a submit runs: the Miles ``train.py`` command line (direct mode), the upstream launcher command
line (launcher mode) or the rehearsal driver, plus the job's runtime environment. Pure."""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import PurePosixPath

from miles_ray.core.builders import POLYAXON_VERSION, miles_env, ray_auth
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.names import label_safe
from miles_ray.core.planner import Plan
from miles_ray.core.recipes import Recipe

RUN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


def submission_id(cluster: str, run: str) -> str:
    """Deterministic Ray job id for a run: re-submitting the same run never starts a second job."""
    return f"miles-ray-{cluster}-{run}"


def default_run_name(recipe: Recipe, plan: Plan, created: str) -> str:
    """A readable, unique-enough run name: recipe, size and a short stamp (created: ISO time)."""
    stamp = hashlib.sha256(f"{recipe.content_hash()}{created}".encode()).hexdigest()[:6]
    base = re.sub(r"[^a-z0-9]+", "-", recipe.name.lower()).strip("-")[:24]
    return f"{base}-{plan.nodes}n-{stamp}"


def train_args(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str, *,
               num_rollout: int | None = None, enable_eval: bool = True, save: bool = True) -> list[str]:
    """Miles ``train.py`` flags for a recipe (mirrors upstream ``scripts/run_qwen3_dense.py``) with the
    planned split flags in place of the launcher's always-colocated ones."""
    model_dir = PurePosixPath(cfg.model_dir)
    data_dir = PurePosixPath(cfg.data_dir)
    ckpt = f"{output_dir}/checkpoints"
    args = [
        "--hf-checkpoint", str(model_dir / recipe.hf_dir),
        "--ref-load", str(model_dir / recipe.megatron_dir),
        "--load", ckpt,
    ]
    if save:
        args += ["--save", ckpt, "--save-interval", "20"]
    args += [
        "--prompt-data", str(data_dir / recipe.train_data),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rollout-shuffle",
        "--rm-type", "deepscaler",
        "--num-rollout", str(num_rollout or recipe.num_rollout),
        "--rollout-batch-size", str(recipe.rollout_batch_size),
        "--n-samples-per-prompt", str(recipe.n_samples_per_prompt),
        "--rollout-max-response-len", "8192", "--rollout-temperature", "1",
        "--global-batch-size", str(recipe.global_batch_size),
        "--balance-data",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    ]
    if recipe.optimizer_cpu_offload:
        args += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    args += [
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--tensor-model-parallel-size", str(recipe.tensor_parallel), "--sequence-parallel",
        "--pipeline-model-parallel-size", str(recipe.pipeline_parallel),
        "--context-parallel-size", str(recipe.context_parallel),
        "--expert-model-parallel-size", str(recipe.expert_parallel),
        "--expert-tensor-parallel-size", str(recipe.expert_tensor_parallel),
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(recipe.max_tokens_per_gpu),
    ]
    if enable_eval and recipe.eval_data:
        args += [
            "--eval-interval", "20", "--eval-prompt-data", "aime", str(data_dir / recipe.eval_data),
            "--n-samples-per-eval-prompt", "16", "--eval-max-response-len", "16384", "--eval-top-p", "1",
        ]
    args += ["--sglang-mem-fraction-static", str(recipe.sglang_mem_fraction_static)]
    args += [
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash",
    ]
    return args + list(plan.miles_args)


def direct_entrypoint(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str,
                      extra_args: list[str] | None = None, **kw) -> str:
    """``python3 <miles root>/train.py <model args> <train + split flags>`` as a Ray job entrypoint.

    Model architecture flags live in ``<miles root>/scripts/models/<type>.sh`` (a bash array MODEL_ARGS),
    exactly as the upstream launchers source them; bash expands it on the node that runs the driver.
    """
    root = PurePosixPath(cfg.miles_root)
    models_sh = root / "scripts" / "models" / f"{recipe.megatron_model_type}.sh"
    script = f'source {shlex.quote(str(models_sh))} && exec python3 {shlex.quote(str(root / "train.py"))} "${{MODEL_ARGS[@]}}" "$@"'
    args = train_args(cfg, recipe, plan, output_dir, **kw) + list(extra_args or [])
    return shlex.join(["bash", "-c", script, "miles-train", *args])


def rehearsal_entrypoint(driver: str, plan: Plan, timeout: float, hold: float = 0) -> str:
    """The rehearsal driver with the same split flags train.py would get (``hold``: seconds to keep the placed
    actors after the checks, failing if one dies)."""
    return shlex.join(["python3", driver, *plan.miles_args, "--timeout", str(int(timeout)),
                       *(["--hold", str(int(hold))] if hold else [])])


def launcher_argv(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str, run_id: str,
                  extra_args: list[str] | None = None) -> list[str]:
    """The upstream launcher's command line (run where the Miles checkout lives, never inside a Ray job)."""
    argv = ["python3", str(PurePosixPath(cfg.miles_root) / recipe.launcher),
            "--model-name", recipe.name, *plan.launcher_args,
            "--model-dir", cfg.model_dir, "--data-dir", cfg.data_dir, "--output-dir", output_dir,
            "--megatron-path", cfg.megatron_path, "--run-id", run_id]
    if extra_args:
        argv += ["--extra-args", shlex.join(extra_args)]
    return argv


def job_env(cfg: MilesRayConfig, dashboard_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Runtime env of the job (and of the launcher process): the values Miles needs on an existing head."""
    env = dict(extra or {})
    env.update(miles_env(cfg))
    env.update({
        "RAY_ADDRESS": dashboard_url,
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTHONPATH": f"{cfg.miles_root}:{cfg.megatron_path}",
    })
    return dict(sorted(env.items()))


def launcher_job_operation(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, image: str, run: str, output_dir: str,
                           head_url: str, extra_args: list[str] | None = None) -> dict:
    """A Polyaxon ``kind: job`` that runs the upstream launcher in the Miles image, in the cluster, against
    the existing head (``MILES_SCRIPT_EXTERNAL_RAY=1``, ``RAY_ADDRESS`` = the head service). The launcher
    only submits, so the pod asks for no GPU; it gets the same connection (the launcher resolves paths)."""
    argv = launcher_argv(cfg, recipe, plan, output_dir, run, extra_args)
    env = dict(miles_env(cfg))
    env["RAY_ADDRESS"] = head_url
    return {
        "version": POLYAXON_VERSION,
        "kind": "operation",
        "name": f"{cfg.name}-{run}"[:63],
        "tags": sorted({"miles-ray", "launcher", label_safe(recipe.name)}),
        "component": {
            "version": POLYAXON_VERSION,
            "kind": "component",
            "name": f"{cfg.name}-{run}"[:63],
            "description": f"upstream launcher {recipe.launcher} for run {run} on the existing head {head_url}, by miles-ray",
            "run": {
                "kind": "job",
                "connections": [cfg.connection],
                "container": {
                    "image": image,
                    "workingDir": cfg.miles_root,
                    "command": argv[:2],
                    "args": argv[2:],
                    # the head's Ray token by reference to its Secret (never the value)
                    "env": [{"name": k, "value": v} for k, v in sorted(env.items())]
                           + ray_auth(cfg, kuberay_managed=False)[1],
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                },
            },
        },
    }
