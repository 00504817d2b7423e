"""The recipe model: what one Miles launcher recipe needs from the cluster, checked field by field and against the
flags its job carries, and the hash that says when a recipe changed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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
_HASH_IF_SET = ("train_backend", "launcher_min_nodes", "not_planned")


class Recipe(BaseModel):
    """One training recipe. Field names follow Megatron / Miles flag names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    launcher: str = Field("scripts/run_qwen3_dense.py", description="upstream launcher script")
    megatron_model_type: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                            description="scripts/models/<type>.py (none for FSDP recipes)")
    train_backend: Literal["megatron", "fsdp"] = "megatron"
    hf_dir: str = Field(min_length=1, description="HF weights dir under the model dir")
    megatron_dir: str | None = Field(None, min_length=1, description=(
        "the --ref-load dir under the model dir (a converted torch_dist checkpoint, or the HF dir in bridge mode); "
        "none when the launcher passes no --ref-load"))
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
    launcher_min_nodes: int | None = Field(
        None, ge=2, description=("smallest --num-nodes at which the upstream launcher submits this layout (below it "
                                 "it refuses or switches to a debug layout)"))
    launcher_args: list[str] = Field(default_factory=list,
                                     description="flags passed to the upstream launcher to pick this recipe")
    hardware: Hardware = Field("nvidia", description="accelerators the launcher targets (amd/npu: not plannable)")
    hardware_note: str = ""
    not_planned: str = Field("", description=("why the launcher's layout is listed, not planned (it changes with the "
                                              "node count, or the planner cannot express it); empty: planned"))
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
        if self.train_backend == "megatron" and not self.megatron_model_type:
            raise ValueError("a Megatron recipe needs megatron_model_type (scripts/models/<type>.py)")
        if self.launcher_min_nodes and self.launcher_max_nodes and self.launcher_min_nodes > self.launcher_max_nodes:
            raise ValueError(f"launcher_min_nodes {self.launcher_min_nodes} > launcher_max_nodes "
                             f"{self.launcher_max_nodes}")
        if self.default_layout == "disaggregated" and not (self.default_actor_nodes and self.default_rollout_gpus):
            raise ValueError("a disaggregated recipe needs default_actor_nodes and default_rollout_gpus")
        split = sorted(set(self.train_args) & set(SPLIT_FLAGS))
        if split:
            raise ValueError(f"train_args must not set the split flags {', '.join(split)} (the planner sets them)")
        flags = self.flag_values()
        steps = flags.get("--num-steps-per-rollout")
        if steps and "--global-batch-size" not in flags and _number(steps):
            derived = self.samples_per_rollout // int(_number(steps))
            if derived != self.global_batch_size:
                raise ValueError(f"train_args pass --num-steps-per-rollout {steps}: global batch size is "
                                 f"{self.rollout_batch_size} x {self.n_samples_per_prompt} / {steps} = {derived}, "
                                 f"but global_batch_size is {self.global_batch_size}")
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
        """False for launchers that need hardware the planner cannot plan (AMD ROCm, Ascend NPU) and for launchers
        whose layout is not one static recipe (``not_planned``)."""
        return self.hardware == "nvidia" and not self.not_planned

    @property
    def not_plannable_reason(self) -> str:
        if self.hardware != "nvidia":
            return f"{self.hardware.upper()} hardware" + (f" ({self.hardware_note})" if self.hardware_note else "")
        return self.not_planned

    @property
    def capturable(self) -> bool:
        return self.plannable

    def content_hash(self) -> str:
        """A stable hash of everything that changes what training does (used to gate resume)."""
        payload = self.model_dump(exclude={"description"})
        for key in _HASH_IF_SET:  # fields added later: left out at their default, so older hashes stay valid
            if payload[key] == type(self).model_fields[key].default:
                del payload[key]
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None

