"""What a submit runs: the Miles ``train.py`` command line (direct mode), the upstream launcher command
line (launcher mode) or the rehearsal driver, plus the job's runtime environment. Pure."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath

from miles_ray.core.builders import POLYAXON_VERSION, miles_env, ray_auth_env, ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
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


# Env vars the upstream launcher (execute_train) passes through from the environment it submits from.
ENV_PASSTHROUGH = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_DEBUG_FILE")


def _fill(token: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        token = token.replace("{" + key + "}", value)
    return token


def filled_train_args(cfg: MilesRayConfig, recipe: Recipe, output_dir: str, run_id: str) -> list[str]:
    """The recipe's captured ``train_args`` with the directories filled in (``output_dir`` and ``run_id`` as the
    launcher's ``--output-dir`` / ``--run-id``)."""
    values = {"model_dir": cfg.model_dir, "data_dir": cfg.data_dir, "output_dir": output_dir, "run_id": run_id}
    return [_fill(t, values) for t in recipe.train_args]


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value train.py's parser ends up with for ``flag`` in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``;
    the last one wins, as with argparse), or None when it is not given."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def checkpoint_dirs(argv: list[str]) -> tuple[str | None, str | None]:
    """(``--save``, ``--load``) of a train.py command line: where Miles writes its checkpoints and where it looks
    for the one to continue (``<dir>/latest_checkpointed_iteration.txt``; without one it starts from --ref-load)."""
    return flag_value(argv, "--save"), flag_value(argv, "--load")


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with every value of ``flag`` replaced by ``value``, or ``flag value`` appended when absent."""
    out, found = list(args), False
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1], found = value, True
        elif arg.startswith(flag + "="):
            out[i], found = f"{flag}={value}", True
    return out if found else [*out, flag, value]


def train_args(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str, run_id: str, *,
               num_rollout: int | None = None, load_dir: str | None = None) -> list[str]:
    """Every ``train.py`` flag the upstream launcher passes for the recipe (:func:`filled_train_args`), then the
    planned split flags in place of the launcher's. ``load_dir`` (a resumed run: the checkpoint dir of the run it
    continues) becomes ``--load``'s value, or is added as ``--load`` when the recipe passes none."""
    if not recipe.train_args:
        raise ConfigError(f"recipe {recipe.name!r} has no train_args: direct mode builds train.py's command line "
                          "from them", hint="add model_args and train_args to the recipe (docs/recipes.md), or "
                                            "use --mode launcher")
    args = filled_train_args(cfg, recipe, output_dir, run_id)
    if load_dir:
        args = set_flag(args, "--load", load_dir)
    if num_rollout:
        args = set_flag(args, "--num-rollout", str(num_rollout))
    return args + list(plan.miles_args)


def direct_argv(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str, run_id: str,
                extra_args: list[str] | None = None, *, num_rollout: int | None = None,
                load_dir: str | None = None) -> list[str]:
    """``python3 <miles root>/train.py <model args> <train flags> <split flags> <extra args>``: the upstream
    launcher's ``ray job submit`` entrypoint, with the model architecture flags inlined as the launcher does
    (from ``scripts/models/<type>.py`` at the pinned commit; nothing is sourced on the node)."""
    return ["python3", str(PurePosixPath(cfg.miles_root) / "train.py"), *recipe.model_args,
            *train_args(cfg, recipe, plan, output_dir, run_id, num_rollout=num_rollout, load_dir=load_dir),
            *(extra_args or [])]


def _path_join(*parts: str | None) -> str:
    entries = [e for p in parts if p for e in p.split(":") if e]
    return ":".join(dict.fromkeys(entries))


def direct_job_env(cfg: MilesRayConfig, dashboard_url: str, recipe: Recipe, environ: Mapping[str, str],
                   extra: dict[str, str] | None = None) -> dict[str, str]:
    """The runtime env of a direct-mode job: what the upstream launcher's ``execute_train`` puts there for the
    recipe, computed from ``environ`` (the environment submit runs in) as the launcher computes it from its own,
    plus miles-ray's values (:data:`MILES_RAY_ENV`) and the user's env (config env, ``extra`` = --env).

    Launcher values: PYTHONUNBUFFERED, CUDA_DEVICE_MAX_CONNECTIONS (not for FSDP), NCCL_NVLS_ENABLE (the config's
    value, as miles-ray sets it for the launcher), the :data:`ENV_PASSTHROUGH` variables set in ``environ``,
    ``MASTER_ADDR`` (``environ``'s, else 127.0.0.1) and ``no_proxy=127.0.0.1,<MASTER_ADDR>``, the recipe's
    ``launcher_env`` (``{master_addr}`` filled in), and PYTHONPATH = Miles root, Megatron, then the user's and
    ``environ``'s PYTHONPATH appended (duplicates dropped)."""
    master = environ.get("MASTER_ADDR", "127.0.0.1")
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if recipe.cuda_device_max_connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    env.update({k: environ[k] for k in ENV_PASSTHROUGH if k in environ})
    env.update({"no_proxy": f"127.0.0.1,{master}", "MASTER_ADDR": master})
    env.update({k: v.replace("{master_addr}", master) for k, v in recipe.launcher_env.items()})
    env.update(extra or {})
    env.update(miles_env(cfg))
    env["RAY_ADDRESS"] = dashboard_url
    env["PYTHONPATH"] = _path_join(cfg.miles_root, cfg.megatron_path, (extra or {}).get("PYTHONPATH"),
                                   cfg.env.get("PYTHONPATH"), environ.get("PYTHONPATH"))
    return dict(sorted(env.items()))


def rehearsal_entrypoint(driver: str, plan: Plan, timeout: float, hold: float = 0,
                         extra_args: list[str] | None = None) -> str:
    """The rehearsal driver with the split flags train.py would get, then the user's --extra-args as train.py
    gets them (they may change the placement: --debug-train-only, --eval-num-gpus, ...; ``hold``: seconds to keep
    the placed actors after the checks, failing if one dies)."""
    return shlex.join(["python3", driver, *plan.miles_args, *(extra_args or []), "--timeout", str(int(timeout)),
                       *(["--hold", str(int(hold))] if hold else [])])


def launcher_argv(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, output_dir: str, run_id: str,
                  extra_args: list[str] | None = None) -> list[str]:
    """The upstream launcher's command line (run where the Miles checkout lives, never inside a Ray job)."""
    argv = ["python3", str(PurePosixPath(cfg.miles_root) / recipe.launcher),
            *recipe.launcher_args, *plan.launcher_args,
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
                           head_url: str, extra_args: list[str] | None = None, run_id: str | None = None,
                           head_auth: tuple[str, str | None] | None = None) -> dict:
    """A Polyaxon ``kind: job`` that runs the upstream launcher in the Miles image, in the cluster, against
    the existing head (``MILES_SCRIPT_EXTERNAL_RAY=1``, ``RAY_ADDRESS`` = the head service). The launcher
    only submits, so the pod asks for no GPU; it gets the same connection (the launcher resolves paths).
    ``head_auth``: the head's Ray auth, (mode, the Secret holding its token) -- the job's ``ray`` commands need
    that very token, by reference; default the config's (``ray_auth``, :func:`ray_token_secret`)."""
    argv = launcher_argv(cfg, recipe, plan, output_dir, run_id or run, extra_args)
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
                           + ray_auth_env(*(head_auth or (cfg.ray_auth, ray_token_secret(cfg)))),
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                },
            },
        },
    }
