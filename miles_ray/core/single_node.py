"""The Polyaxon-Miles guide's first step, "start with one job": a single-node Polyaxon job that runs the upstream Miles
launcher in one pod. The launcher starts its own Ray inside the pod, so there is no KubeRay, no external
Ray and no ``rayVersion`` here. Pure: config in, operation dict out.

Shape (the guide's component, wrapped in ``kind: operation`` like :func:`builders.build_operation`):
``plugins.shm: true``, ``run.kind: job``, ``connections: [<connection>]``, the pinned image,
``workingDir: <miles_root>``, ``command: ["python", <recipe launcher>]``, the launcher's flags
(``--model-name``, ``--num-gpus-per-node``, ``--model-dir``, ``--data-dir``,
``--output-dir <mount>/<runs_dir>/{{ globals.uuid }}``) and ``nvidia.com/gpu: G`` limits and requests.
Added to the guide's shape: Ray token authentication (``ray_auth``, on by default) as container env --
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the token Secret (``ray_auth_secret``, default named after
the cluster; key ``auth_token``), which the launcher's own ``ray start --head`` and ``ray job submit`` read.

Memory budget. Polyaxon's shm plugin mounts an emptyDir with ``medium: Memory`` at ``/dev/shm``: every
byte written there is charged to the pod's memory cgroup, so the pod's memory must cover what lives in
shared memory on top of what the processes allocate. What lives there in this job:

* the Ray object store (plasma) of the launcher's local Ray: Ray sizes it at 30 % of the memory it sees
  (the pod's cgroup limit) and puts it in ``/dev/shm`` -> ``OBJECT_STORE_FRACTION`` of the limit;
* NCCL's intra-node SHM transport and proxy buffers: ``NCCL_SHM_GIB_PER_GPU`` = 1 GiB per GPU (a few
  hundred MiB per rank is typical; 1 GiB leaves room for more channels);

and outside shared memory:

* the per-GPU processes (a Megatron trainer rank and its share of an SGLang engine, CUDA contexts,
  the dataloader, and weights/optimizer state offloaded to host memory while the colocated side
  sleeps): ``PROCESS_GIB_PER_GPU`` = 16 GiB per GPU;
* Ray's own daemons (GCS, raylet, dashboard, log monitor) and the launcher: ``SYSTEM_GIB`` = 8 GiB.

So ``memory >= 0.3 * memory + G * (1 + 16) GiB + 8 GiB``, i.e. ``memory >= (17 G + 8) / 0.7`` GiB:
206 GiB for 8 GPUs, 109 GiB for 4. It is a floor that catches pods which cannot work (a 64Gi pod with
8 GPUs dies in the first weight sync), not a sizing guide: large recipes with CPU Adam need much more.
A ``memory_per_node`` below the floor is refused. With a Polyaxon preset, CPU and memory come from the
preset (the budget is printed as a warning, since the preset cannot be read offline).
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any

from miles_ray.core.builders import ray_auth_env, ray_token_secret
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError
from miles_ray.core.names import label_safe
from miles_ray.core.recipes import DENSE_LAUNCHER, Recipe

POLYAXON_VERSION = 1.1
GPU = "nvidia.com/gpu"
RUN_UUID = "{{ globals.uuid }}"

OBJECT_STORE_FRACTION = 0.3   # Ray's default object_store_memory proportion, placed in /dev/shm
NCCL_SHM_GIB_PER_GPU = 1      # NCCL SHM transport / proxy buffers per GPU, in /dev/shm
PROCESS_GIB_PER_GPU = 16      # trainer rank + SGLang share + offloaded state, per GPU
SYSTEM_GIB = 8                # Ray daemons and the launcher

_GI = 2**30
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3}
_TRUE = {"1", "true", "yes", "on"}


def quantity_bytes(value: str) -> float:
    """A Kubernetes quantity (``512Gi``, ``200G``, ``1e3``) in bytes."""
    s = str(value).strip()
    m = re.fullmatch(r"^([0-9.]+)([A-Za-z]*)$", s)
    if not m or (m.group(2) and m.group(2) not in _SUFFIX):
        raise ConfigError(f"{value!r} is not a Kubernetes quantity such as 512Gi")
    return float(m.group(1)) * (_SUFFIX[m.group(2)] if m.group(2) else 1)


def memory_floor_gib(gpus: int) -> int:
    """The smallest pod memory (GiB, rounded up) that holds /dev/shm plus the processes (module doc)."""
    fixed = gpus * (NCCL_SHM_GIB_PER_GPU + PROCESS_GIB_PER_GPU) + SYSTEM_GIB
    return math.ceil(fixed / (1 - OBJECT_STORE_FRACTION))


def memory_budget(cfg: MilesRayConfig) -> dict[str, Any]:
    """The budget for ``cfg.memory_per_node`` with ``cfg.gpus_per_node`` GPUs, in GiB."""
    g = cfg.gpus_per_node
    mem = quantity_bytes(cfg.memory_per_node) / _GI
    return {
        "memory_gib": round(mem, 2),
        "object_store_shm_gib": round(OBJECT_STORE_FRACTION * mem, 2),
        "nccl_shm_gib": g * NCCL_SHM_GIB_PER_GPU,
        "processes_gib": g * PROCESS_GIB_PER_GPU,
        "system_gib": SYSTEM_GIB,
        "floor_gib": memory_floor_gib(g),
    }


def check_memory(cfg: MilesRayConfig) -> dict[str, Any]:
    """Refuse a pod memory below the floor (ConfigError naming every term of the budget)."""
    b = memory_budget(cfg)
    if b["memory_gib"] < b["floor_gib"]:
        raise ConfigError(
            f"memory_per_node {cfg.memory_per_node} is below the single-node floor of {b['floor_gib']}Gi for "
            f"{cfg.gpus_per_node} GPUs: /dev/shm is charged to the pod (Ray object store "
            f"{OBJECT_STORE_FRACTION:.0%} of memory + NCCL {b['nccl_shm_gib']}Gi) on top of the processes "
            f"({b['processes_gib']}Gi) and Ray/launcher ({SYSTEM_GIB}Gi)",
            hint=f"pass a node with more memory (memory_per_node >= {b['floor_gib']}Gi) or fewer --gpus-per-node")
    return b


def launcher_args(cfg: MilesRayConfig, recipe: Recipe) -> list[str]:
    """The guide's launcher flags, in the guide's order."""
    out_dir = str(PurePosixPath(cfg.mount_path) / cfg.runs_dir) + "/" + RUN_UUID
    return ["--model-name", recipe.name, "--num-gpus-per-node", str(cfg.gpus_per_node),
            "--model-dir", cfg.model_dir, "--data-dir", cfg.data_dir, "--output-dir", out_dir]


def check_single_node(cfg: MilesRayConfig, recipe: Recipe) -> None:
    """What a one-pod launcher job cannot do, refused up front."""
    if recipe.launcher != DENSE_LAUNCHER:
        raise ConfigError(
            f"--single-node renders the Polyaxon-Miles guide's job for {DENSE_LAUNCHER}; recipe {recipe.name} uses {recipe.launcher}",
            hint="pick a dense Qwen3 recipe ('miles-ray recipes'), or use the multi-node path (render/up without "
                 "--single-node)")
    if recipe.default_layout == "disaggregated" or cfg.layout == "disaggregated":
        raise ConfigError(f"recipe {recipe.name} is disaggregated; the upstream launcher in one pod is colocated",
                          hint="drop --layout disaggregated, or use the multi-node path")
    if cfg.nodes != 1:
        raise ConfigError(f"--single-node is one pod, not {cfg.nodes} nodes",
                          hint="drop --nodes, or render the multi-node raycluster without --single-node")
    ext = cfg.env.get("MILES_SCRIPT_EXTERNAL_RAY", "").lower()
    if ext in _TRUE:
        raise ConfigError("env MILES_SCRIPT_EXTERNAL_RAY is set: in a single-node job the launcher must start its "
                          "own Ray inside the pod (there is no external head)",
                          hint="remove MILES_SCRIPT_EXTERNAL_RAY from 'env' for --single-node")


def build_single_node(cfg: MilesRayConfig, recipe: Recipe, image: str,
                      tags: list[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(operation, warnings): the guide's single-node component inside a ``kind: operation``."""
    check_single_node(cfg, recipe)
    g = str(cfg.gpus_per_node)
    warnings: list[str] = []
    if cfg.polyaxon_preset:
        # The preset owns CPU and memory; only the accelerator request is explicit (the guide's shape).
        resources = {"limits": {GPU: g}, "requests": {GPU: g}}
        warnings.append(f"CPU and memory come from preset {cfg.polyaxon_preset!r}: its memory must be >= "
                        f"{memory_floor_gib(cfg.gpus_per_node)}Gi (/dev/shm counts toward the pod's memory)")
    else:
        check_memory(cfg)
        q = {"cpu": str(cfg.cpus_per_node), "memory": cfg.memory_per_node, GPU: g}
        resources = {"limits": dict(q), "requests": dict(q)}
    container: dict[str, Any] = {
        "image": image,
        "workingDir": cfg.miles_root,
        "command": ["python", recipe.launcher],
        "args": launcher_args(cfg, recipe),
        "resources": resources,
    }
    # Ray token auth of the Ray the launcher starts in the pod (its dashboard listens on 0.0.0.0:8265, so any pod
    # that reaches this one could run code without it): RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the cluster's
    # token Secret, by reference. The launcher's `ray start --head` and its `ray job submit` both read them.
    container["env"] = ([{"name": k, "value": v} for k, v in sorted(cfg.env.items())]
                        + ray_auth_env(cfg.ray_auth, ray_token_secret(cfg)))
    run: dict[str, Any] = {"kind": "job", "connections": [cfg.connection], "container": container}
    placement: dict[str, Any] = {}
    if cfg.node_selector:
        placement["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        placement["tolerations"] = [t.model_dump(exclude_none=True) for t in cfg.tolerations]
    if placement:
        run["environment"] = placement
    component: dict[str, Any] = {
        "version": POLYAXON_VERSION,
        "kind": "component",
        "name": cfg.name,
        "description": f"Miles {recipe.name} on one node x {g} GPUs (the upstream launcher starts Ray in the pod), "
                       "by miles-ray",
        "tags": ["miles-ray", "single-node", label_safe(recipe.name)],
        "plugins": {"shm": True},
        "run": run,
    }
    op: dict[str, Any] = {
        "version": POLYAXON_VERSION,
        "kind": "operation",
        "name": cfg.name,
        "tags": sorted({"miles-ray", "single-node", label_safe(recipe.name), *(tags or [])}),
        "component": component,
    }
    if cfg.polyaxon_preset:
        op["presets"] = [cfg.polyaxon_preset]
    return op, warnings
