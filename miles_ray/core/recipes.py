"""Recipe catalog: what each Miles launcher recipe needs from the cluster.

A recipe carries the parallel sizes Megatron uses (TP, PP, CP, EP, ETP), the SGLang engine size
(GPUs per rollout engine), batch sizes, the model facts the split rules need (attention heads,
experts) and the directory names the launcher reads. The built-in catalog mirrors the upstream
Miles launchers (``scripts/run_qwen3_dense.py`` and friends); users add their own with a YAML file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from miles_ray.core.errors import ConfigError
from miles_ray.core.safe_yaml import load_yaml_file
from miles_ray.core.upstream_jobs import JOBS, UPSTREAM_MILES_COMMIT

__all__ = ["BUILTIN", "UPSTREAM_MILES_COMMIT", "Recipe", "SPLIT_FLAGS", "catalog", "get_recipe"]

Layout = Literal["colocated", "disaggregated"]
# The split flags the planner sets (flag -> number of values); a recipe's train_args never carry them.
SPLIT_FLAGS = {"--colocate": 0, "--actor-num-nodes": 1, "--actor-num-gpus-per-node": 1, "--num-gpus-per-node": 1,
               "--rollout-num-gpus-per-engine": 1, "--rollout-num-gpus": 1}
# train.py flags that must agree with the recipe's own fields (the planner checks the fields).
_FLAG_FIELDS = {
    "--tensor-model-parallel-size": "tensor_parallel", "--pipeline-model-parallel-size": "pipeline_parallel",
    "--context-parallel-size": "context_parallel", "--expert-model-parallel-size": "expert_parallel",
    "--expert-tensor-parallel-size": "expert_tensor_parallel", "--global-batch-size": "global_batch_size",
    "--rollout-batch-size": "rollout_batch_size", "--n-samples-per-prompt": "n_samples_per_prompt",
    "--max-tokens-per-gpu": "max_tokens_per_gpu", "--sglang-mem-fraction-static": "sglang_mem_fraction_static",
    "--num-rollout": "num_rollout", "--num-attention-heads": "attention_heads", "--num-experts": "num_experts",
}
Hardware = Literal["nvidia", "amd", "npu"]


class Recipe(BaseModel):
    """One training recipe. Field names follow Megatron / Miles flag names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    launcher: str = Field("scripts/run_qwen3_dense.py", description="upstream launcher script")
    megatron_model_type: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    hf_dir: str = Field(min_length=1, description="HF weights dir under the model dir")
    megatron_dir: str = Field(min_length=1, description="converted torch_dist checkpoint dir")
    train_data: str = "dapo-math-17k/dapo-math-17k.jsonl"
    eval_data: str | None = "aime-2024/aime-2024.jsonl"
    tensor_parallel: int = Field(1, ge=1, le=1024)
    pipeline_parallel: int = Field(1, ge=1, le=1024)
    context_parallel: int = Field(1, ge=1, le=1024)
    expert_parallel: int = Field(1, ge=1, le=4096)
    expert_tensor_parallel: int = Field(1, ge=1, le=1024)
    rollout_gpus_per_engine: int = Field(ge=1, le=4096)
    attention_heads: int = Field(ge=1, le=65536)
    num_experts: int = Field(0, ge=0, le=65536, description="0 for dense models")
    global_batch_size: int = Field(256, ge=1, le=1 << 24)
    rollout_batch_size: int = Field(32, ge=1, le=1 << 20)
    n_samples_per_prompt: int = Field(8, ge=1, le=4096)
    max_tokens_per_gpu: int = Field(9216, ge=1, le=1 << 24)
    sglang_mem_fraction_static: float = Field(0.7, gt=0, le=1)
    optimizer_cpu_offload: bool = False
    num_rollout: int = Field(3000, ge=1)
    default_layout: Layout = "colocated"
    default_actor_nodes: int | None = Field(None, ge=1, description="disaggregated: trainer nodes")
    default_rollout_gpus: int | None = Field(None, ge=1, description="disaggregated: rollout GPUs")
    launcher_max_nodes: int | None = Field(None, ge=1, description="largest --num-nodes the upstream launcher accepts")
    launcher_args: list[str] = Field(default_factory=list,
                                     description="flags passed to the upstream launcher to pick this recipe")
    hardware: Hardware = Field("nvidia", description="accelerators the launcher targets (amd/npu: not plannable)")
    hardware_note: str = ""
    capture_nodes: list[int] = Field(default_factory=list,
                                     description="node counts (besides 1, 2, 4) the parity captures cover")
    model_args: list[str] = Field(default_factory=list,
                                  description="model architecture flags of train.py (upstream scripts/models/<type>.py)")
    train_args: list[str] = Field(
        default_factory=list,
        description=("every other train.py flag the launcher passes, in its order, without the split flags; "
                     "{model_dir}, {data_dir}, {output_dir} and {run_id} are filled in at submit"))
    launcher_env: dict[str, str] = Field(default_factory=dict, description="env vars the launcher adds to the job")
    cuda_device_max_connections: bool = Field(True, description="CUDA_DEVICE_MAX_CONNECTIONS=1 in the job (not FSDP)")

    @field_validator("hf_dir", "megatron_dir", "train_data", "eval_data", "launcher")
    @classmethod
    def _relative_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        p = Path(v)
        if p.is_absolute() or ".." in p.parts or "\x00" in v or "\\" in v:
            raise ValueError(f"{v!r} must be a relative path inside its directory (no '/', '..' at the start)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        if self.num_experts and self.num_experts % self.expert_parallel:
            raise ValueError(
                f"num_experts {self.num_experts} is not divisible by expert_parallel {self.expert_parallel}"
            )
        if not self.num_experts and self.expert_parallel > 1:
            raise ValueError("expert_parallel > 1 needs num_experts (a MoE model)")
        if self.default_layout == "disaggregated" and not (self.default_actor_nodes and self.default_rollout_gpus):
            raise ValueError("a disaggregated recipe needs default_actor_nodes and default_rollout_gpus")
        split = sorted(set(self.train_args) & set(SPLIT_FLAGS))
        if split:
            raise ValueError(f"train_args must not set the split flags {', '.join(split)} (the planner sets them)")
        flags = self.flag_values()
        for flag, name in _FLAG_FIELDS.items():
            if flag in flags and _number(flags[flag]) != _number(getattr(self, name)):
                raise ValueError(f"{'model_args' if flag in ('--num-attention-heads', '--num-experts') else 'train_args'}"
                                 f" pass {flag} {flags[flag]} but {name} is {getattr(self, name)}")
        return self

    def flag_values(self) -> dict[str, str]:
        """The first value of every valued flag in model_args + train_args (``--flag value``)."""
        out: dict[str, str] = {}
        args = [*self.model_args, *self.train_args]
        for flag, value in zip(args, args[1:]):
            if flag.startswith("--") and not value.startswith("--"):
                out.setdefault(flag, value)
        return out

    @property
    def num_layers(self) -> int | None:
        value = self.flag_values().get("--num-layers")
        return int(value) if value and value.isdigit() else None

    def pipeline_edge_layers(self) -> tuple[int | None, int | None]:
        """(first, last) pipeline stage layer counts when the launcher makes them uneven."""
        flags = self.flag_values()
        first, last = (flags.get(f"--decoder-{w}-pipeline-num-layers") for w in ("first", "last"))
        return (int(first) if first and first.isdigit() else None, int(last) if last and last.isdigit() else None)

    @property
    def model_parallel(self) -> int:
        """TP*PP*CP: the size of one data-parallel replica."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def plannable(self) -> bool:
        """False for launchers that need hardware the planner cannot plan (AMD ROCm, Ascend NPU)."""
        return self.hardware == "nvidia"

    @property
    def capturable(self) -> bool:
        return self.plannable

    def content_hash(self) -> str:
        """A stable hash of everything that changes what training does (used to gate resume)."""
        payload = self.model_dump(exclude={"description"})
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _upstream(name: str) -> dict:
    """The captured upstream job data of a built-in recipe (miles_ray.core.upstream_jobs)."""
    return dict(JOBS[name])


def _dense(name: str, model_type: str, tp: int, max_tokens: int, engine: int, mem: float, cpu_adam: bool,
           heads: int, num_rollout: int = 3000) -> Recipe:
    return Recipe(
        name=name,
        description=f"{name} dense GRPO (upstream scripts/run_qwen3_dense.py)",
        megatron_model_type=model_type,
        hf_dir=name,
        megatron_dir=f"{name}_torch_dist",
        tensor_parallel=tp,
        max_tokens_per_gpu=max_tokens,
        rollout_gpus_per_engine=engine,
        sglang_mem_fraction_static=mem,
        optimizer_cpu_offload=cpu_adam,
        attention_heads=heads,
        num_rollout=num_rollout,
        launcher_args=["--model-name", name],
        **_upstream(name),
    )


# Values from radixark/miles scripts/run_qwen3_dense.py (_RECIPES) and scripts/models/*.sh (heads).
BUILTIN: dict[str, Recipe] = {
    r.name: r
    for r in (
        _dense("Qwen3-4B", "qwen3-4B", 2, 9216, 2, 0.7, False, heads=32),
        _dense("Qwen3-32B", "qwen3-32B", 8, 20480, 8, 0.7, True, heads=64, num_rollout=5),
        _dense("Qwen3.5-4B", "qwen3.5-4B", 2, 9216, 1, 0.7, False, heads=16),
        _dense("Qwen3.5-9B", "qwen3.5-9B", 2, 9216, 1, 0.6, False, heads=16),
        _dense("Qwen3.5-27B", "qwen3.5-27B", 4, 8192, 1, 0.5, True, heads=24),
        _dense("Qwen3.6-27B", "qwen3.6-27B", 4, 8192, 1, 0.5, True, heads=24),
        _dense("Qwen3.8-27B", "qwen3.8-27B", 4, 8192, 1, 0.8, True, heads=24),
        Recipe(
            name="Qwen3-30B-A3B",
            description="Qwen3-30B-A3B MoE GRPO on H100 (upstream scripts/run_qwen3_30b_a3b.py): TP4, EP8",
            launcher="scripts/run_qwen3_30b_a3b.py",
            megatron_model_type="qwen3-30B-A3B",
            hf_dir="Qwen3-30B-A3B",
            megatron_dir="Qwen3-30B-A3B_torch_dist",
            tensor_parallel=4,
            expert_parallel=8,
            rollout_gpus_per_engine=8,
            attention_heads=32,
            num_experts=128,
            max_tokens_per_gpu=32768,
            optimizer_cpu_offload=True,
            launcher_max_nodes=1,  # the upstream launcher implements H100 x 1 node only
            launcher_args=["--model-name", "Qwen3-30B-A3B"],
            **_upstream("Qwen3-30B-A3B"),
        ),
        Recipe(
            name="Qwen3-235B-A22B",
            description=(
                "Qwen3-235B-A22B MoE GSPO, disaggregated (upstream scripts/run_qwen3_235b_a22b.py): "
                "8 trainer nodes TP4/PP4/CP2/EP16, 64 rollout GPUs, 32 GPUs per engine, FP8 rollout weights"
            ),
            launcher="scripts/run_qwen3_235b_a22b.py",
            megatron_model_type="qwen3-235B-A22B",
            hf_dir="Qwen3-235B-A22B-FP8",
            megatron_dir="Qwen3-235B-A22B_torch_dist",
            tensor_parallel=4,
            pipeline_parallel=4,
            context_parallel=2,
            expert_parallel=16,
            rollout_gpus_per_engine=32,
            attention_heads=64,
            num_experts=128,
            max_tokens_per_gpu=16384,
            global_batch_size=64,
            rollout_batch_size=8,
            optimizer_cpu_offload=True,
            default_layout="disaggregated",
            default_actor_nodes=8,
            default_rollout_gpus=64,
            launcher_args=["--model-name", "Qwen3-235B-A22B"],
            capture_nodes=[16],
            **_upstream("Qwen3-235B-A22B"),
        ),
        # Launchers for hardware miles-ray cannot plan: listed and marked, refused by plan and submit.
        Recipe(
            name="Qwen3-4B-AMD",
            description="Qwen3-4B GRPO on AMD MI350X/MI355X (upstream scripts/amd/run_qwen3_4b.py)",
            launcher="scripts/amd/run_qwen3_4b.py", megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B",
            megatron_dir="Qwen3-4B_torch_dist", tensor_parallel=2, rollout_gpus_per_engine=2, attention_heads=32,
            hardware="amd", hardware_note="ROCm on MI350X/MI355X", launcher_args=["--hardware", "MI355X"],
        ),
        Recipe(
            name="Qwen3-30B-A3B-AMD",
            description="Qwen3-30B-A3B MoE GRPO on AMD MI350X/MI355X (upstream scripts/amd/run_qwen3_30b_a3b.py)",
            launcher="scripts/amd/run_qwen3_30b_a3b.py", megatron_model_type="qwen3-30B-A3B",
            hf_dir="Qwen3-30B-A3B", megatron_dir="Qwen3-30B-A3B_torch_dist", tensor_parallel=1, expert_parallel=4,
            rollout_gpus_per_engine=2, attention_heads=32, num_experts=128, max_tokens_per_gpu=16384,
            hardware="amd", hardware_note="ROCm on MI350X/MI355X", launcher_args=["--hardware", "MI355X"],
            launcher_max_nodes=1,
        ),
        Recipe(
            name="Qwen3-4B-NPU",
            description="Qwen3-4B GRPO on Ascend NPU (upstream scripts/run_qwen3_4b_npu.py)",
            launcher="scripts/run_qwen3_4b_npu.py", megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B",
            megatron_dir="Qwen3-4B_torch_dist", tensor_parallel=4, rollout_gpus_per_engine=1, attention_heads=32,
            max_tokens_per_gpu=4096, sglang_mem_fraction_static=0.6, hardware="npu", hardware_note="Ascend NPU",
        ),
    )
}

DENSE_LAUNCHER = "scripts/run_qwen3_dense.py"


class RecipeFile(BaseModel):
    """A user recipe file: ``recipes: [ {name: ..., ...}, ... ]``."""

    model_config = ConfigDict(extra="forbid")
    recipes: list[Recipe] = Field(min_length=1)


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {loc}: {first['msg']}{more}"


def load_recipe_file(path: str | Path) -> dict[str, Recipe]:
    data = load_yaml_file(path, what="recipe file")
    try:
        parsed = RecipeFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_one_line(e, f"recipe file {path}"),
                          hint="see docs/recipes.md for the fields a recipe needs") from None
    out: dict[str, Recipe] = {}
    for r in parsed.recipes:
        if r.name in out:
            raise ConfigError(f"recipe file {path}: recipe {r.name!r} is defined twice")
        out[r.name] = r
    return out


def catalog(recipe_file: str | Path | None = None) -> dict[str, Recipe]:
    """Built-in recipes, overlaid by the user's file (a user recipe may replace a built-in one)."""
    recipes = dict(BUILTIN)
    if recipe_file:
        recipes.update(load_recipe_file(recipe_file))
    return recipes


def get_recipe(name: str, recipe_file: str | Path | None = None) -> Recipe:
    recipes = catalog(recipe_file)
    if name in recipes:
        return recipes[name]
    lowered = {k.lower(): k for k in recipes}
    if name.lower() in lowered:
        return recipes[lowered[name.lower()]]
    import difflib

    close = difflib.get_close_matches(name, list(recipes), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run 'miles-ray recipes' to list them"
    raise ConfigError(f"unknown recipe {name!r}", hint=hint)
