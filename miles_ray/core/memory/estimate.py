"""The estimate: the train.py flags it reads, then the most loaded trainer GPU, a rollout engine's GPU, the host
memory of the most loaded node and the checkpoints on the claim, each held against what is known to be there.

Sources of the accounting (read them; the code below is ours):

* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
  ``compute_activation_memory``, ``compute_activation_memory_without_sp``): the most loaded model shard
  ``(block / PP + embedding) / TP`` (+ the output layer when untied and PP == 1); 18 bytes per parameter, or
  ``6 + 12 / DP`` with the distributed optimizer; activations per layer from Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", Table 2.
* Megatron-LM ``megatron/core/transformer/moe``: experts live ``num_experts / EP`` per rank and are split by ETP,
  not TP.
* radixark/miles ``miles/backends/megatron_utils/arguments.py`` (``set_default_megatron_args``): the distributed
  optimizer is always on; ``miles/utils/arguments.py``: ``--colocate`` implies ``--offload-train`` and
  ``--offload-rollout`` unless ``--no-offload-...`` says otherwise; with ``--optimizer-cpu-offload`` (Megatron's
  HybridDeviceOptimizer) the fp32 master weights and Adam moments (12 bytes per parameter) live in host memory.
* SGLang ``python/sglang/srt/model_executor/model_runner.py`` (``profile_max_num_token``): the KV pool is what
  ``--mem-fraction-static`` of the GPU leaves after the weights and whatever else is already on the GPU
  (``rest = available - total * (1 - f)``); nothing left: SGLang refuses to start ("Not enough memory").
* Ray: the object store lives in /dev/shm and is charged to the pod as it fills (default cap 30 % of memory);
  NCCL's SHM transport also lives there (see miles_ray.core.single_node).

What is not modelled is covered by :data:`MARGIN` and the fixed reserves below (the package doc lists it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from miles_ray.core.errors import ConfigError
from miles_ray.core.memory.gpu import GIB
from miles_ray.core.memory.model import ModelShape, Parameters, _flags, model_shape, padded_vocab, parameters
from miles_ray.core.planner import Plan
from miles_ray.core.recipes import Recipe

MARGIN = 0.05                   # share added to every modelled GPU figure for what is not modelled (package doc)
CUDA_RESERVE = 2 * GIB          # per process on a GPU: CUDA context, NCCL communicators and workspaces
HOST_TRAINER_PROCESS = 6 * GIB  # host memory of one Megatron rank outside its tensors (Python, CUDA, dataloader)
HOST_SGLANG_PROCESS = 4 * GIB   # host memory of one SGLang GPU worker process
HOST_NCCL_SHM_PER_GPU = 1 * GIB  # NCCL SHM transport in /dev/shm (miles_ray.core.single_node)
HOST_RAY_SYSTEM = 8 * GIB       # Ray daemons (raylet, agents, log monitor) and the driver on a node
HOST_OBJECT_STORE_USE = 8 * GIB  # what Miles keeps in the object store at once (rollout batches, metadata)
DEFAULT_SEQ_LENGTH = 4096       # Miles' default --seq-length (set_default_megatron_args) when not dynamic batching
PROMPT_ALLOWANCE = 1024         # prompt tokens counted on top of --rollout-max-response-len for one KV sequence

Part = Literal["trainer", "rollout", "host", "storage"]

# Models whose Hugging Face weights (what SGLang loads) are stored quantized: megatron_model_type -> (bytes per
# parameter, what the model card says).
ROLLOUT_WEIGHTS: dict[str, tuple[float, str]] = {
    "kimi-k2": (1.0, "FP8 block-quantized weights (moonshotai/Kimi-K2-Instruct model card)"),
    "kimi-k25": (0.5, "native INT4 weights of the routed experts (moonshotai/Kimi-K2.5 model card)"),
}


# -- the job's flags -----------------------------------------------------------------------------------------------

class JobFlags(BaseModel):
    """The train.py flags the estimate reads: the recipe's, then --extra-args (the later one wins)."""

    optimizer_cpu_offload: bool
    lora: bool
    sequence_parallel: bool
    recompute: Literal["full", "selective", "none"]
    dynamic_batch: bool
    max_tokens_per_gpu: int
    micro_batch_size: int
    seq_length: int
    mem_fraction: float
    offload_train: bool
    offload_rollout: bool
    ref_model: bool
    max_response_len: int
    save_interval: int | None
    save_retain_interval: int | None
    save_optim: bool
    num_rollout: int


def job_flags(recipe: Recipe, plan: Plan, extra_args: Sequence[str] = (), num_rollout: int | None = None) -> JobFlags:
    f = _flags([*recipe.train_args, *extra_args])

    def value(flag: str, default, kind=int):
        v = f.get(flag)
        if not v:
            return default
        try:
            return kind(v[0])
        except ValueError:
            raise ConfigError(f"{flag} {v[0][:40]!r} is not a number", hint="fix --extra-args") from None

    def switch(on: str, off: str, default: bool) -> bool:
        """``--x`` / ``--no-x``: whichever the job passes last (extra args after the recipe's)."""
        last = None
        for i, a in enumerate([*recipe.train_args, *extra_args]):
            if a in (on, off):
                last = (i, a == on)
        return default if last is None else last[1]

    granularity = value("--recompute-granularity", "none", str)
    mem = value("--sglang-mem-fraction-static", recipe.sglang_mem_fraction_static, float)
    if not 0 < mem <= 1:
        raise ConfigError(f"--sglang-mem-fraction-static {mem} is not in (0, 1]", hint="fix --extra-args")
    tokens = value("--max-tokens-per-gpu", recipe.max_tokens_per_gpu)
    if tokens < 1:
        raise ConfigError(f"--max-tokens-per-gpu {tokens} must be >= 1", hint="fix --extra-args")
    return JobFlags(
        optimizer_cpu_offload=switch("--optimizer-cpu-offload", "--no-optimizer-cpu-offload",
                                     recipe.optimizer_cpu_offload),
        lora="--lora-rank" in f, sequence_parallel="--sequence-parallel" in f,
        recompute=granularity if granularity in ("full", "selective") else "none",
        dynamic_batch="--use-dynamic-batch-size" in f, max_tokens_per_gpu=tokens,
        micro_batch_size=max(value("--micro-batch-size", 1), 1), seq_length=max(value("--seq-length", DEFAULT_SEQ_LENGTH), 1),
        mem_fraction=mem,
        offload_train=switch("--offload-train", "--no-offload-train", plan.colocate),
        offload_rollout=switch("--offload-rollout", "--no-offload-rollout", plan.colocate),
        ref_model="--use-kl-loss" in f or "--ref-load" in f,
        max_response_len=max(value("--rollout-max-response-len", 8192), 1),
        save_interval=value("--save-interval", None) if "--save" in f else None,
        save_retain_interval=value("--save-retain-interval", None),
        save_optim="--no-save-optim" not in f,
        num_rollout=num_rollout or value("--num-rollout", recipe.num_rollout))


# -- the estimate --------------------------------------------------------------------------------------------------

class TrainerMemory(BaseModel):
    parameters_per_gpu: int
    bytes_per_parameter: float
    distributed_optimizer: bool
    optimizer_offload: bool
    data_parallel: int
    weights_and_optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int


class RolloutMemory(BaseModel):
    weights_bytes_per_gpu: int
    kv_cache_bytes_per_gpu: int
    peak_bytes: int


class HostMemory(BaseModel):
    bytes_per_node: int
    limit_bytes: int | None


class StorageMemory(BaseModel):
    checkpoint_bytes: int
    checkpoints_kept: int
    bytes_needed: int
    capacity_bytes: int | None


class FitLine(BaseModel):
    """One part of the fit: what it needs, what is there (None: unknown, not checked), the headroom."""

    part: Part
    needed_bytes: int
    available_bytes: int | None
    what: str = Field(description="what 'available' is, e.g. '80.0 GiB GPU' or 'memory_per_node 512Gi'")

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.needed_bytes <= self.available_bytes

    @property
    def headroom(self) -> float | None:
        if not self.available_bytes:
            return None
        return 1 - self.needed_bytes / self.available_bytes


class MemoryEstimate(BaseModel):
    """``-o json``'s ``memory``: exactly the keys the issue names (bytes as integers); ``lines``, ``notes`` and
    ``gpu_source`` are for the table and the misfit line (left out of the JSON)."""

    gpu_bytes: int | None
    parameters: int
    fits: bool
    trainer: TrainerMemory
    rollout: RolloutMemory
    host: HostMemory
    storage: StorageMemory
    lines: list[FitLine] = Field(default_factory=list, exclude=True)
    notes: list[str] = Field(default_factory=list, exclude=True)
    gpu_source: str = Field("", exclude=True)

    def misfits(self) -> list[FitLine]:
        return [line for line in self.lines if not line.fits]


def _stage_layers(recipe: Recipe, layers: int) -> tuple[int, int]:
    """Decoder layers on the (first, last) pipeline stage (Megatron's uneven first/last stages included)."""
    pp = recipe.pipeline_parallel
    if pp == 1:
        return layers, layers
    first, last = recipe.pipeline_edge_layers()
    middle = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    even = -(-rest // middle) if middle > 0 else 0
    return (first if first is not None else even), (last if last is not None else even)


def _trainer(recipe: Recipe, plan: Plan, shape: ModelShape, flags: JobFlags
             ) -> tuple[TrainerMemory, float, float, int]:
    """The most loaded trainer GPU: (memory, parameters on it, host bytes its optimizer offload needs, dp)."""
    tp, pp, cp = recipe.tensor_parallel, recipe.pipeline_parallel, recipe.context_parallel
    ep, etp = recipe.expert_parallel, recipe.expert_tensor_parallel
    p = parameters(recipe, shape, tp)
    trainer_gpus = max(plan.trainer_gpus, 1)
    dp = max(trainer_gpus // max(tp * pp * cp, 1), 1)
    expert_dp = max(trainer_gpus // max(ep * etp * pp, 1), 1)
    first_layers, last_layers = _stage_layers(recipe, shape.layers)
    per_layer_dense = (p.block_dense / shape.layers) / tp
    per_layer_experts = (p.block_experts / max(shape.moe_layers, 1)) / (ep * etp) * (shape.moe_layers / shape.layers)
    emb = p.embedding / tp
    first = (first_layers * (per_layer_dense + per_layer_experts) + emb
             + (emb if p.untied and pp == 1 else 0) + ((p.mtp_dense / tp + p.mtp_experts / (ep * etp)) if pp == 1 else 0))
    last = (last_layers * (per_layer_dense + per_layer_experts) + (emb if p.untied else 0)
            + p.mtp_dense / tp + p.mtp_experts / (ep * etp))
    # the expert share of the most loaded GPU, sharded over the expert-data-parallel ranks by the optimizer
    on_first = first >= last
    params = first if on_first else last
    expert_share = ((first_layers if on_first else last_layers) * per_layer_experts
                    + (p.mtp_experts / (ep * etp) if (pp == 1 or not on_first) else 0))
    dense_share = params - expert_share
    if flags.lora:
        # frozen bf16 base weights; the adapters, their gradients and optimizer are small (in the margin)
        gpu_bytes, host_opt = 2 * params, 0.0
    else:
        optimizer = 12 * (dense_share / (dp * cp) + expert_share / expert_dp)  # distributed optimizer, always on
        gpu_bytes = 6 * params + (0 if flags.optimizer_cpu_offload else optimizer)
        host_opt = optimizer if flags.optimizer_cpu_offload else 0.0
    acts = _activations(recipe, shape, flags, p, on_first)
    # the colocated phases: training with SGLang released (what it keeps: its CUDA context) or resident (f x GPU)
    peak = (gpu_bytes + acts) * (1 + MARGIN) + CUDA_RESERVE
    if plan.colocate:
        peak += CUDA_RESERVE  # the SGLang process's own context stays on the GPU
    bpp = gpu_bytes / params if params else 0.0
    return (TrainerMemory(parameters_per_gpu=round(params), bytes_per_parameter=round(bpp, 3),
                          distributed_optimizer=not flags.lora, optimizer_offload=flags.optimizer_cpu_offload,
                          data_parallel=dp, weights_and_optimizer_bytes=round(gpu_bytes),
                          activations_bytes=round(acts), peak_bytes=round(peak)), params, host_opt, dp)


def _activations(recipe: Recipe, shape: ModelShape, flags: JobFlags, p: Parameters, on_first: bool) -> float:
    """Korthikanti et al. 2022 Table 2 as Megatron's theoretical_memory_usage writes it, for the tokens one GPU holds
    in a micro-batch (``--max-tokens-per-gpu`` with dynamic batching, else micro-batch x seq-length / CP)."""
    tp, pp = recipe.tensor_parallel, recipe.pipeline_parallel
    tokens = (flags.max_tokens_per_gpu if flags.dynamic_batch
              else flags.micro_batch_size * flags.seq_length / recipe.context_parallel)
    h = shape.hidden
    moe_ffn = shape.topk * shape.moe_ffn + shape.shared_ffn if shape.experts else 0
    ffn = max(shape.ffn if shape.layers > shape.moe_layers else 0, moe_ffn)
    sp = tp if flags.sequence_parallel else 1
    full_layer = tokens * h * (18 + 4 * ffn / h) / sp if flags.sequence_parallel else tokens * h * (10 + 24 / tp)
    first_layers, last_layers = _stage_layers(recipe, shape.layers)
    layers = first_layers if on_first else last_layers
    in_flight = pp if on_first else 1  # the first stage holds PP micro-batches (1F1B)
    if flags.recompute == "full":
        # each layer keeps its input; one layer's activations exist while it is recomputed
        stored = layers * in_flight * 2 * tokens * h / sp + full_layer
    else:
        stored = layers * in_flight * full_layer
    # embedding output, and on the last stage the logits: bf16 and the fp32 log-softmax of the loss
    stored += in_flight * tokens * h * 2 / sp
    if pp == 1 or not on_first:
        stored += tokens * padded_vocab(shape, tp) / tp * 6 + tokens * h * 4
    return stored


def rollout_weight_bytes(recipe: Recipe, extra_args: Sequence[str] = ()) -> tuple[float, str]:
    """Bytes per parameter of the weights SGLang loads: bf16, or what the HF checkpoint is stored in (an ``-FP8``
    dir, a natively quantized model: :data:`ROLLOUT_WEIGHTS`), or ``--sglang-quantization``."""
    f = _flags([*recipe.train_args, *extra_args])
    quant = (f.get("--sglang-quantization") or [""])[0].lower()
    if "fp8" in quant or "fp8" in recipe.hf_dir.lower():
        return 1.0, "FP8"
    if "int4" in quant or "awq" in quant or "gptq" in quant:
        return 0.5, "INT4"
    return ROLLOUT_WEIGHTS.get(recipe.megatron_model_type or "", (2.0, "bf16"))


def _kv_bytes_per_token(shape: ModelShape, engine_gpus: int) -> float:
    """Bytes of KV cache per token on one GPU of an engine: K and V of every layer, bf16 (MLA: the latent)."""
    if shape.mla is not None:
        return shape.layers * (shape.mla[1] + shape.mla[3]) * 2
    kv_heads = max(shape.query_groups / engine_gpus, 1)  # a KV head is replicated when TP > KV heads
    return 2 * shape.layers * kv_heads * shape.kv_channels * 2


def estimate(recipe: Recipe, plan: Plan, gpu_bytes: int | None = None, memory_per_node: int | None = None,
             storage_capacity: int | None = None, extra_args: Sequence[str] = (), num_rollout: int | None = None,
             gpu_source: str = "", keep_checkpoints: int | None = None, keep_best: bool = False) -> MemoryEstimate:
    """The memory of ``recipe`` split as ``plan`` says: per GPU (trainer, rollout), per node (host) and on the
    claim (storage), each held against what is known to be there (None: not checked). ``keep_checkpoints`` /
    ``keep_best``: the run's retention (submit --keep-checkpoints N / --keep-best): at most N (1 when only
    --keep-best is given) + 1 (the best) checkpoints stay on the claim (:func:`kept_by_retention`)."""
    shape = model_shape(recipe)
    flags = job_flags(recipe, plan, extra_args, num_rollout)
    trainer, params_per_gpu, host_opt, dp = _trainer(recipe, plan, shape, flags)
    p = parameters(recipe, shape, recipe.tensor_parallel)
    total = p.total
    notes: list[str] = [f"parameters: {p.source}"]

    # rollout: SGLang's static pool (f x GPU) holds its weights, whatever else is on the GPU, and the KV cache
    e = plan.rollout_num_gpus_per_engine
    weight_bytes, weight_dtype = rollout_weight_bytes(recipe, extra_args)
    weights = weight_bytes * total / e
    if weight_bytes != 2:
        notes.append(f"rollout weights: {weight_dtype}")
    # its own context, and colocated the trainer's (offloaded, or without --offload-train counted in the trainer's
    # share: SGLang reserves its fraction first and the trainer lives in the rest)
    resident = CUDA_RESERVE + (CUDA_RESERVE if plan.colocate else 0)
    one_sequence = _kv_bytes_per_token(shape, e) * (flags.max_response_len + PROMPT_ALLOWANCE)
    needed_pool = (weights + resident) * (1 + MARGIN) + one_sequence
    kv = (flags.mem_fraction * gpu_bytes - (weights + resident) * (1 + MARGIN)) if gpu_bytes else 0.0
    rollout = RolloutMemory(weights_bytes_per_gpu=round(weights), kv_cache_bytes_per_gpu=max(round(kv), 0),
                            peak_bytes=round(max(needed_pool, flags.mem_fraction * gpu_bytes if gpu_bytes else 0)))

    # trainer's phase: SGLang released (offload-rollout) or holding its f x GPU
    lines: list[FitLine] = []
    gpu_what = f"{gpu_bytes / GIB:.1f} GiB GPU" if gpu_bytes else "GPU memory unknown"
    trainer_available = gpu_bytes
    if plan.colocate and not flags.offload_rollout and gpu_bytes:
        trainer_available = round(gpu_bytes * (1 - flags.mem_fraction))
        gpu_what += f" - SGLang's {flags.mem_fraction:g} (no --offload-rollout)"
    lines.append(FitLine(part="trainer", needed_bytes=trainer.peak_bytes, available_bytes=trainer_available,
                         what=gpu_what))
    lines.append(FitLine(part="rollout", needed_bytes=round(needed_pool),
                         available_bytes=round(flags.mem_fraction * gpu_bytes) if gpu_bytes else None,
                         what=(f"--sglang-mem-fraction-static {flags.mem_fraction:g} of {gpu_bytes / GIB:.1f} GiB"
                               if gpu_bytes else "GPU memory unknown")))

    # host, on the most loaded node (a trainer node): per GPU its processes, the offloaded optimizer and the
    # weight copies Miles keeps in host memory (the reference model, the weights restored after offload-train)
    g = plan.gpus_per_node
    copies = (1 if flags.ref_model else 0) + (1 if flags.offload_train else 0)
    per_trainer_gpu = host_opt + copies * 2 * params_per_gpu + HOST_TRAINER_PROCESS
    rollout_on_node = g if plan.colocate else 0
    host = (g * per_trainer_gpu + rollout_on_node * HOST_SGLANG_PROCESS + g * HOST_NCCL_SHM_PER_GPU
            + HOST_RAY_SYSTEM + HOST_OBJECT_STORE_USE)
    if not plan.colocate and plan.rollout_num_gpus:
        rollout_node = g * (HOST_SGLANG_PROCESS + HOST_NCCL_SHM_PER_GPU) + HOST_RAY_SYSTEM + HOST_OBJECT_STORE_USE
        host = max(host, rollout_node)
    host_memory = HostMemory(bytes_per_node=round(host), limit_bytes=memory_per_node)
    lines.append(FitLine(part="host", needed_bytes=round(host), available_bytes=memory_per_node,
                         what=f"memory_per_node {memory_per_node / GIB:.0f}Gi" if memory_per_node
                         else "pod memory not given (memory_per_node)"))

    # storage: a torch_dist checkpoint holds bf16 weights (+ the fp32 optimizer states unless --no-save-optim)
    ckpt = total * (2 + (12 if flags.save_optim and not flags.lora else 0))
    if flags.save_interval:
        saved = flags.num_rollout // flags.save_interval
        kept = (min(saved, flags.num_rollout // flags.save_retain_interval + 1) if flags.save_retain_interval
                else saved)
    else:
        kept = 0
    cap = kept_by_retention(keep_checkpoints, keep_best)
    if cap is not None:
        kept = min(kept, cap)
    storage = StorageMemory(checkpoint_bytes=round(ckpt), checkpoints_kept=kept, bytes_needed=round(ckpt * kept),
                            capacity_bytes=storage_capacity)
    lines.append(FitLine(part="storage", needed_bytes=round(ckpt * kept), available_bytes=storage_capacity,
                         what="the claim's capacity" if storage_capacity else "claim capacity unknown"))
    if gpu_bytes and kv <= one_sequence:
        notes.append("SGLang would have no room for the KV cache of one sequence: it refuses to start "
                     "('Not enough memory')")
    return MemoryEstimate(gpu_bytes=gpu_bytes, parameters=total, fits=all(line.fits for line in lines),
                          trainer=trainer, rollout=rollout, host=host_memory, storage=storage, lines=lines,
                          notes=notes, gpu_source=gpu_source)


def kept_by_retention(keep_checkpoints: int | None, keep_best: bool) -> int | None:
    """How many complete checkpoints the run's retention keeps (:class:`miles_ray.core.supervision.Retention`: the
    newest N, 1 when only a metric is given, + the best by the metric); None: no retention, every one stays."""
    if keep_checkpoints is None and not keep_best:
        return None
    return (keep_checkpoints or 1) + (1 if keep_best else 0)
