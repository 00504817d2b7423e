#!/usr/bin/env python3
"""Capture what the upstream Miles launchers submit, for the direct-mode parity tests (not shipped).

Given a Miles checkout (e.g. ``git -C <mirror> archive <commit> | tar -x -C /tmp/miles``), this runs each catalog
recipe's upstream launcher (``scripts/run_*.py``) exactly as ``miles-ray submit --mode launcher`` would invoke it
(:func:`miles_ray.core.entrypoint.launcher_argv`), for 1, 2 and 4 nodes (plus a recipe's own
``capture_nodes``), with the launcher's command execution replaced by a recorder: ``exec_command_cpu`` /
``exec_command_gpu`` of ``miles.utils.external_utils.command_utils`` are swapped for a function that records the
command and returns (``nvidia-smi`` probes get "0"). Nothing is executed, downloaded or submitted. The recorded
``ray job submit`` command is parsed into the ``train.py`` argv and the runtime env, and written to
``tests/data/upstream_miles/<short commit>/<recipe>-<nodes>n.json`` together with the commit, the command that
made it, the launcher argv and the submitting environment it ran with. A launcher that refuses a size (raises)
is recorded with ``refused`` and its error. Sizes outside a recipe's ``launcher_min_nodes``..``launcher_max_nodes``
(where the launcher runs a debug cut or asks for its own node count) are recorded but give no catalog data.
Recipes that are not planned (AMD/NPU hardware, ``not_planned`` layouts) are listed and not run.

Each case runs in a fresh child interpreter (``--one``): the launchers compute defaults (run ids) at import and
read ``os.environ``; a child keeps cases independent. The child gets a fixed, minimal environment
(:data:`SUBMIT_ENV`): external Ray, a dashboard address, ``MASTER_ADDR``, two socket interface names (to show
the pass-through), ``NCCL_NVLS_ENABLE=0`` (what miles-ray sets for the launcher) and a ``PYTHONPATH`` entry (to
show the append); no ``WANDB_API_KEY`` (the launchers then add no wandb flags) and no ``MODEL_ARGS_*``.

Stubbed imports: the launchers import ``miles.utils.external_utils.command_utils``, which imports
``miles.utils.external_utils.exec_command`` (ray, and torch through ``miles.utils.misc``) and
``miles.utils.http_utils`` (httpx, and torch through the event logger). The child puts two stand-in modules under
those names before importing anything: the recorder (``exec_command_cpu/gpu/multi_node``) and a
``wait_for_server_ready`` that fails. Everything else is the checkout's own code (typer is needed).

The checkout path is replaced by ``/root/miles`` (where the Miles image has it) in everything recorded.

With ``--catalog`` it also regenerates ``miles_ray/core/upstream_jobs.json``: per recipe, the model args and the
``train.py`` flags with the split flags set aside, as a template over the capture's directories.

Usage::

    git -C <mirror of radixark/miles> archive <commit> | tar -x -C /tmp/miles
    .venv/bin/python tools/capture_upstream_jobs.py --miles /tmp/miles --commit <40 hex> [--catalog]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGE_MILES_ROOT = "/root/miles"
NODE_SIZES = (1, 2, 4)
GPUS_PER_NODE = 8
RUN_ID = "capture-run"
# Distinct values, so the catalog template can be recovered from the capture by substitution.
MODEL_DIR = "/capture/models"
DATA_DIR = "/capture/datasets"
OUTPUT_DIR = f"/capture/outputs/{RUN_ID}"
SUBMIT_ENV = {
    "MILES_SCRIPT_EXTERNAL_RAY": "1",
    "RAY_ADDRESS": "http://capture-head:8265",
    "MASTER_ADDR": "10.0.0.1",
    "NCCL_SOCKET_IFNAME": "eth0",
    "GLOO_SOCKET_IFNAME": "eth0",
    "NCCL_NVLS_ENABLE": "0",
    "PYTHONPATH": "/opt/capture-extra",
}


# -- the child: run one launcher with a recorder ------------------------------------------------------

def run_one(miles: Path, argv: list[str], out: Path) -> None:
    sys.path.insert(0, str(miles))
    recorded: list[str] = []

    def record(cmd: str, capture_output: bool = False):
        recorded.append(cmd)
        return "0" if capture_output else None  # nvidia-smi probes: no NVLink seen

    def record_multi(cmd: str, capture_output: bool = False, num_nodes: int | None = None):
        return [record(cmd, capture_output)]

    def never(*args, **kwargs):
        raise RuntimeError("the capture waited for a server; nothing runs here")

    # The recorder stands in for the module that executes commands; its real imports (ray, torch through
    # miles.utils.misc) are not needed. http_utils is only used to wait for servers the capture never starts.
    execs = types.ModuleType("miles.utils.external_utils.exec_command")
    execs.exec_command_cpu, execs.exec_command_gpu, execs.exec_command_multi_node = record, record, record_multi
    http = types.ModuleType("miles.utils.http_utils")
    http.wait_for_server_ready = never
    sys.modules[execs.__name__], sys.modules[http.__name__] = execs, http
    import miles.utils.external_utils.command_utils as U  # noqa: E402 (the checkout's)

    assert U.exec_command_cpu is record
    sys.argv = [argv[1], *argv[2:]]
    os.chdir(miles)
    refused = None
    try:
        runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            refused = f"SystemExit({e.code})"
    except BaseException as e:  # the launcher's own refusal (NotImplementedError, AssertionError, ...)
        refused = f"{type(e).__name__}: {e}".rstrip(": ")
    out.write_text(json.dumps({"recorded": recorded, "refused": refused,
                               "stubbed_imports": [execs.__name__, http.__name__]}))


# -- the parent: every recipe x size ------------------------------------------------------------------

def _normalize(value, checkout: str):
    if isinstance(value, str):
        return value.replace(checkout, IMAGE_MILES_ROOT)
    if isinstance(value, list):
        return [_normalize(v, checkout) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v, checkout) for k, v in value.items()}
    return value


def parse_submit(cmd: str) -> dict:
    """``export ... && ray job submit [--address=...] --runtime-env-json=JSON -- python3 train.py ARGS``."""
    words = shlex.split(cmd)
    i = words.index("submit")
    j = words.index("--", i)
    opts = words[i + 1:j]
    env_json = next(o.split("=", 1)[1] for o in opts if o.startswith("--runtime-env-json="))
    argv = words[j + 1:]
    return {"ray_job_submit_options": [o for o in opts if not o.startswith("--runtime-env-json=")],
            "entrypoint_argv": argv, "runtime_env": json.loads(env_json)}


def capture(miles: Path, commit: str, recipe, nodes: int, command: str) -> dict:
    from miles_ray.core.config import load_config
    from miles_ray.core.entrypoint import launcher_argv
    from miles_ray.core.planner import plan_split

    cfg = load_config({"name": "capture", "nodes": nodes, "gpus_per_node": GPUS_PER_NODE}, environ={})
    plan = plan_split(recipe, nodes, GPUS_PER_NODE, with_suggestions=False)
    cfg = cfg.model_copy(update={"miles_root": str(miles)})
    argv = launcher_argv(cfg, recipe, plan, OUTPUT_DIR, RUN_ID)
    argv = _with(argv, {"--model-dir": MODEL_DIR, "--data-dir": DATA_DIR})
    out = Path(f"/tmp/capture-{os.getpid()}.json")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **SUBMIT_ENV}
    proc = subprocess.run([sys.executable, __file__, "--one", str(miles), str(out), "--", *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise SystemExit(f"capture child failed for {recipe.name} {nodes}n:\n{proc.stderr[-3000:]}")
    child = json.loads(out.read_text())
    out.unlink()
    submits = [c for c in child["recorded"] if "ray job submit" in c]
    result = {
        "upstream_commit": commit,
        "made_by": command,
        "recipe": recipe.name,
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "launcher_argv": argv,
        "submit_env": SUBMIT_ENV,
        "paths": {"model_dir": MODEL_DIR, "data_dir": DATA_DIR, "output_dir": OUTPUT_DIR, "run_id": RUN_ID,
                  "miles_root": IMAGE_MILES_ROOT},
        "stubbed_imports": child["stubbed_imports"],
        "refused": child["refused"],
        "other_commands": [c for c in child["recorded"] if "ray job submit" not in c],
    }
    if submits and not child["refused"]:
        result.update(parse_submit(submits[-1]))
    elif not child["refused"]:
        result["refused"] = "no ray job submit was recorded"
    return _normalize(result, str(miles))


def _with(argv: list[str], values: dict[str, str]) -> list[str]:
    argv = list(argv)
    for flag, value in values.items():
        argv[argv.index(flag) + 1] = value
    return argv


# -- the catalog data module ----------------------------------------------------------------------------

SPLIT_FLAGS = {"--colocate": 0, "--actor-num-nodes": 1, "--actor-num-gpus-per-node": 1, "--num-gpus-per-node": 1,
               "--rollout-num-gpus-per-engine": 1, "--rollout-num-gpus": 1}


def template(token: str) -> str:
    for value, name in ((OUTPUT_DIR, "{output_dir}"), (MODEL_DIR, "{model_dir}"), (DATA_DIR, "{data_dir}"),
                        (RUN_ID, "{run_id}")):
        token = token.replace(value, name)
    return token


def catalog_entry(cap: dict, model_arg_count: int) -> dict:
    argv = cap["entrypoint_argv"]
    assert argv[0] == "python3" and argv[1] == f"{IMAGE_MILES_ROOT}/train.py", argv[:2]
    rest = argv[2:]
    model, train = rest[:model_arg_count], rest[model_arg_count:]
    kept, i = [], 0
    while i < len(train):
        if train[i] in SPLIT_FLAGS:
            i += 1 + SPLIT_FLAGS[train[i]]
            continue
        kept.append(template(train[i]))
        i += 1
    base = {"PYTHONUNBUFFERED", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_NVLS_ENABLE", "MASTER_ADDR", "PYTHONPATH",
            *SUBMIT_ENV}
    env = dict(cap["runtime_env"]["env_vars"])
    master = SUBMIT_ENV["MASTER_ADDR"]
    if env.get("no_proxy") == f"127.0.0.1,{master}":
        del env["no_proxy"]  # execute_train's own value; a launcher's other value stays, as a template
    return {"model_args": model, "train_args": kept,
            "launcher_env": {k: v.replace(master, "{master_addr}") for k, v in env.items() if k not in base},
            "cuda_device_max_connections": "CUDA_DEVICE_MAX_CONNECTIONS" in env}


def model_args_of(miles: Path, model_type: str) -> list[str]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from miles.utils.external_utils.model_args_utils import load_model_args as f;"
            "print(f(sys.argv[2]))")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run([sys.executable, "-c", code, str(miles), model_type], env=env, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def write_catalog(miles: Path, commit: str, entries: dict[str, dict], command: str) -> Path:
    """``miles_ray/core/upstream_jobs.json``: what miles_ray.core.upstream_jobs loads (and checks) at import."""
    path = REPO / "miles_ray" / "core" / "upstream_jobs.json"
    jobs = {name: {"model_args": entry["model_args"], "train_args": entry["train_args"],
                   "launcher_env": dict(sorted(entry["launcher_env"].items())),
                   "cuda_device_max_connections": bool(entry["cuda_device_max_connections"])}
            for name, entry in entries.items()}
    path.write_text(json.dumps({"schema": 1, "miles_commit": commit, "made_by": command, "jobs": jobs}, indent=1)
                    + "\n")
    return path


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        miles, out, sep, *argv = sys.argv[2:]
        assert sep == "--"
        run_one(Path(miles), argv, Path(out))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--miles", required=True, type=Path, help="a Miles checkout (an export of one commit)")
    ap.add_argument("--commit", required=True, help="the 40-hex commit the checkout is")
    ap.add_argument("--recipe", action="append", help="only these recipes (default: every built-in recipe)")
    ap.add_argument("--catalog", action="store_true", help="also regenerate miles_ray/core/upstream_jobs.json")
    a = ap.parse_args()
    if not re.fullmatch(r"[0-9a-f]{40}", a.commit):
        ap.error("--commit must be 40 hex digits")
    sys.path.insert(0, str(REPO))
    from miles_ray.core.recipes import BUILTIN

    command = "tools/capture_upstream_jobs.py " + " ".join(
        shlex.quote(x) for x in sys.argv[1:] if not x.startswith(str(a.miles)))
    command = command.replace("--miles ", "--miles <checkout> ")
    outdir = REPO / "tests" / "data" / "upstream_miles" / a.commit[:7]
    outdir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict] = {}
    for recipe in BUILTIN.values():
        if a.recipe and recipe.name not in a.recipe:
            continue
        if not recipe.capturable:
            print(f"{recipe.name}: not captured ({recipe.not_plannable_reason})")
            continue
        sizes = sorted({*NODE_SIZES, *recipe.capture_nodes})
        megatron = recipe.train_backend == "megatron" and recipe.megatron_model_type
        model = model_args_of(a.miles, recipe.megatron_model_type) if megatron else []
        lo, hi = recipe.launcher_min_nodes or 1, recipe.launcher_max_nodes or max(sizes)
        for n in sizes:
            cap = capture(a.miles, a.commit, recipe, n, command)
            (outdir / f"{recipe.name}-{n}n.json").write_text(json.dumps(cap, indent=1) + "\n")
            status = f"refused: {cap['refused']}" if cap["refused"] else "captured"
            print(f"{recipe.name} {n}n: {status}")
            if cap["refused"] or not lo <= n <= hi:
                continue  # outside the sizes the launcher lays this recipe out for: not catalog data
            entry = catalog_entry(cap, len(model))
            assert cap["entrypoint_argv"][2:2 + len(model)] == [template(m) for m in model] or \
                cap["entrypoint_argv"][2:2 + len(model)] == model, f"{recipe.name}: model args differ"
            if recipe.name in entries and entries[recipe.name] != entry:
                raise SystemExit(f"{recipe.name}: the launcher's non-split flags change with the node count "
                                 f"({n} nodes); the catalog needs per-size data")
            entries[recipe.name] = entry
    if a.catalog:
        print(f"wrote {write_catalog(a.miles, a.commit, entries, command)}")


if __name__ == "__main__":
    main()
