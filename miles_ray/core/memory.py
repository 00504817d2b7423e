"""Will it fit? GPU memory, host memory and checkpoint storage of a Miles job, per GPU and per node, before it runs.

Pure: recipe + plan (+ the job's extra flags and what is known of the hardware) in, an estimate out; no I/O.

Sources of the accounting (read them; the code below is ours):

* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``,
  ``compute_activation_memory``, ``compute_activation_memory_without_sp``): the parameter count of a (grouped-query
  or multi-latent attention, dense or MoE, with MTP) GPT from its model args; the most loaded model shard
  ``(block / PP + embedding) / TP`` (+ the output layer when untied and PP == 1); 18 bytes per parameter, or
  ``6 + 12 / DP`` with the distributed optimizer; activations per layer from Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", Table 2.
* Megatron-LM ``megatron/core/transformer/moe``: experts live ``num_experts / EP`` per rank and are split by ETP,
  not TP; vocab padded to a multiple of ``make_vocab_size_divisible_by * TP`` (``_vocab_size_with_padding``).
* radixark/miles ``miles/backends/megatron_utils/arguments.py`` (``set_default_megatron_args``): the distributed
  optimizer is always on; ``miles/utils/arguments.py``: ``--colocate`` implies ``--offload-train`` and
  ``--offload-rollout`` unless ``--no-offload-...`` says otherwise; with ``--optimizer-cpu-offload`` (Megatron's
  HybridDeviceOptimizer) the fp32 master weights and Adam moments (12 bytes per parameter) live in host memory.
* SGLang ``python/sglang/srt/model_executor/model_runner.py`` (``profile_max_num_token``): the KV pool is what
  ``--mem-fraction-static`` of the GPU leaves after the weights and whatever else is already on the GPU
  (``rest = available - total * (1 - f)``); nothing left: SGLang refuses to start ("Not enough memory").
* Ray: the object store lives in /dev/shm and is charged to the pod as it fills (default cap 30 % of memory);
  NCCL's SHM transport also lives there (see miles_ray.core.single_node).

Not modelled, covered by :data:`MARGIN` (a share of every GPU figure) and the fixed reserves below: the CUDA
context and NCCL buffers beyond the reserve, allocator fragmentation, CUDA graphs of SGLang, the router and norm
weights Megatron's formula leaves out, TransformerEngine workspaces, speculative-decoding draft models and
their KV, attention scores of non-flash backends, and the real token count of each dynamic micro-batch (the
estimate takes the cap, ``--max-tokens-per-gpu``). Architectures the formula cannot express from the model args
(hybrid linear-attention or Mamba layers, Gemma 4's layer types) are scaled to their published size
(:data:`PUBLISHED`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from miles_ray.core.errors import ConfigError, PlanError
from miles_ray.core.planner import Plan, plan_split
from miles_ray.core.recipes import Recipe

if TYPE_CHECKING:  # config imports this module (gpu_memory's validator)
    from miles_ray.core.config import MilesRayConfig

GIB = 2**30
MIB = 2**20

MARGIN = 0.05                   # share added to every modelled GPU figure for what is not modelled (module doc)
CUDA_RESERVE = 2 * GIB          # per process on a GPU: CUDA context, NCCL communicators and workspaces
HOST_TRAINER_PROCESS = 6 * GIB  # host memory of one Megatron rank outside its tensors (Python, CUDA, dataloader)
HOST_SGLANG_PROCESS = 4 * GIB   # host memory of one SGLang GPU worker process
HOST_NCCL_SHM_PER_GPU = 1 * GIB  # NCCL SHM transport in /dev/shm (miles_ray.core.single_node)
HOST_RAY_SYSTEM = 8 * GIB       # Ray daemons (raylet, agents, log monitor) and the driver on a node
HOST_OBJECT_STORE_USE = 8 * GIB  # what Miles keeps in the object store at once (rollout batches, metadata)
DEFAULT_SEQ_LENGTH = 4096       # Miles' default --seq-length (set_default_megatron_args) when not dynamic batching
PROMPT_ALLOWANCE = 1024         # prompt tokens counted on top of --rollout-max-response-len for one KV sequence

Part = Literal["trainer", "rollout", "host", "storage"]

# Published total parameters of architectures whose layers Megatron's formula cannot see from the model args
# (megatron_model_type -> (parameters, where it is published)). The estimate scales the transformer block so that
# the total is the published one. Names that say the size are the model cards' own headline numbers.
PUBLISHED: dict[str, tuple[float, str]] = {
    # hybrid Gated DeltaNet / full attention layers (miles_plugins.models.qwen3_5 / qwen3_next specs)
    "qwen3.5-4B": (4e9, "Qwen/Qwen3.5-4B model card (4B)"),
    "qwen3.5-9B": (9e9, "Qwen/Qwen3.5-9B model card (9B)"),
    "qwen3.5-27B": (27e9, "Qwen/Qwen3.5-27B model card (27B)"),
    "qwen3.6-27B": (27e9, "Qwen/Qwen3.6-27B model card (27B)"),
    "qwen3.8-27B": (27e9, "Qwen3.8-27B (27B, as named)"),
    "qwen3.5-35B-A3B": (35e9, "Qwen/Qwen3.5-35B-A3B model card (35B total)"),
    "qwen3.5-35B-A3B_lora": (35e9, "Qwen/Qwen3.5-35B-A3B model card (35B total)"),
    "qwen3.6-35B-A3B": (35e9, "Qwen/Qwen3.6-35B-A3B model card (35B total)"),
    "qwen3-next-80B-A3B": (80e9, "Qwen/Qwen3-Next-80B-A3B model card (80B total)"),
    # hybrid Mamba-2 / attention / MLP-or-MoE layers (Nemotron-H; the bridge builds them from the HF config)
    "nemotron-3-nano-4b": (4e9, "nvidia/NVIDIA-Nemotron-3-Nano-4B model card (4B)"),
    "nemotron-3-nano-30b-a3b": (31.6e9, "NVIDIA Nemotron 3 Nano technical report, arXiv 2512.20848 (31.6B total)"),
    "nemotron-3-ultra-550b-a55b": (550e9, "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B model card (550B total)"),
    # Gemma 4: sliding/global attention layers of different shapes, built by the bridge from the HF config
    "gemma-4-26b-a4b-it": (26e9, "google/gemma-4-26B-A4B-it model card (26B total)"),
    "gemma-4-31b-it": (31e9, "google/gemma-4-31B-it model card (31B)"),
}

# Models whose Hugging Face weights (what SGLang loads) are stored quantized: megatron_model_type -> (bytes per
# parameter, what the model card says).
ROLLOUT_WEIGHTS: dict[str, tuple[float, str]] = {
    "kimi-k2": (1.0, "FP8 block-quantized weights (moonshotai/Kimi-K2-Instruct model card)"),
    "kimi-k25": (0.5, "native INT4 weights of the routed experts (moonshotai/Kimi-K2.5 model card)"),
}

# The memory of the GPUs NVIDIA's GPU feature discovery names in nvidia.com/gpu.product (and AMD's labeller), as
# nvidia-smi reports it in MiB for the board (what nvidia.com/gpu.memory carries); --gpu-memory accepts the names.
GPU_PRODUCTS: dict[str, int] = {
    "A100-SXM4-40GB": 40960 * MIB, "A100-PCIE-40GB": 40960 * MIB,
    "A100-SXM4-80GB": 81920 * MIB, "A100-PCIE-80GB": 81920 * MIB, "A100 80GB PCIe": 81920 * MIB,
    "H100-80GB-HBM3": 81559 * MIB, "H100-SXM5-80GB": 81559 * MIB, "H100-PCIe": 81559 * MIB,
    "H100-NVL": 95830 * MIB, "H200": 143771 * MIB, "H200-NVL": 143771 * MIB, "GH200-480GB": 97871 * MIB,
    "B200": 183359 * MIB, "B300": 275040 * MIB, "GB200": 189471 * MIB,
    "L40S": 46068 * MIB, "L4": 23034 * MIB, "A10G": 23028 * MIB,
    "MI300X": 196592 * MIB, "MI325X": 262128 * MIB, "MI355X": 294896 * MIB,
}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i?B?|[KMGTP]i?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": GIB, "b": 1, "k": 10**3, "kb": 10**3, "ki": 2**10, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mi": MIB, "mib": MIB, "g": 10**9, "gb": 10**9, "gi": GIB, "gib": GIB, "t": 10**12, "tb": 10**12,
          "ti": 2**40, "tib": 2**40, "p": 10**15, "pb": 10**15, "pi": 2**50, "pib": 2**50}
_MAX_GPU = 64 * 2**40  # 64 TiB: anything above is a typo, not a GPU


def parse_size(text: object, what: str = "--gpu-memory") -> int:
    """``80GiB``, ``80Gi``, ``141GB``, ``81559MiB``, a bare number of GiB or a product in :data:`GPU_PRODUCTS`, in
    bytes (ConfigError otherwise, or for zero)."""
    s = str(text)
    m = _SIZE.match(s) if s.isascii() else None
    if not m and s.isascii() and (known := product_memory(s)) is not None:
        return known  # a GPU product name, as NVIDIA's GPU feature discovery labels it (H100-80GB-HBM3, H200 ...)
    if not m:
        shown = s[:40].encode("unicode_escape").decode()
        raise ConfigError(f"{what} {shown!r} is not a memory size or a known GPU product",
                          hint="give it as e.g. 80GiB, 141GB, 81559MiB or H100-80GB-HBM3")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if value < 1 * GIB or value > _MAX_GPU:
        raise ConfigError(f"{what} {s.strip()} is {'zero' if value == 0 else 'out of range'}",
                          hint="give the memory of one GPU, e.g. 80GiB (at least 1GiB)")
    return int(value)


def product_memory(product: str) -> int | None:
    """The table's memory for a product label such as ``NVIDIA-H100-80GB-HBM3`` (vendor prefix optional)."""
    name = re.sub(r"^(NVIDIA|AMD|Instinct)[-_ ]+", "", product.strip(), flags=re.IGNORECASE)
    name = re.sub(r"^(Instinct)[-_ ]+", "", name, flags=re.IGNORECASE)
    keys = {k.lower().replace(" ", "-"): v for k, v in GPU_PRODUCTS.items()}
    return keys.get(name.lower().replace(" ", "-"))


# NVIDIA GPU feature discovery's node labels (gpu-feature-discovery, in the GPU operator): the board's memory in
# MiB as nvidia-smi reports it, and its product name (with a -MIG-... or -SHARED suffix under MIG or sharing)
MEMORY_LABEL = "nvidia.com/gpu.memory"
PRODUCT_LABEL = "nvidia.com/gpu.product"


class LabelledGpu(BaseModel):
    """What the GPU nodes' labels say of one GPU's memory: ``gpu_bytes`` (the smallest over the labelled nodes;
    None: no label says), ``source`` (which label, on how many nodes) and the GPU nodes no label speaks for."""

    gpu_bytes: int | None
    source: str = ""
    unlabelled: list[str] = Field(default_factory=list)


def gpu_memory_from_labels(nodes: dict[str, dict[str, str]]) -> LabelledGpu:
    """One GPU's memory from each GPU node's labels (node name -> labels): ``nvidia.com/gpu.memory`` (MiB), else
    ``nvidia.com/gpu.product`` through :data:`GPU_PRODUCTS`. A product the table does not know, or a memory label
    that is not a number of MiB, is a ConfigError (one line): the job could land on that node."""
    found: dict[str, tuple[int, str]] = {}
    unlabelled: list[str] = []
    for name, labels in sorted(nodes.items()):
        memory, product = labels.get(MEMORY_LABEL), labels.get(PRODUCT_LABEL)
        if memory is not None:
            if not memory.strip().isdigit() or int(memory) == 0:
                raise ConfigError(f"node {name}: label {MEMORY_LABEL}={memory[:40]!r} is not a number of MiB",
                                  hint="fix the label (GPU feature discovery sets it), or pass --gpu-memory SIZE")
            found[name] = (int(memory) * MIB, f"{MEMORY_LABEL}={int(memory)}")
        elif product is not None:
            known = product_memory(re.sub(r"-(MIG|SHARED)\b.*$", "", product))
            if known is None:
                raise ConfigError(f"node {name}: GPU product {product[:60]!r} (label {PRODUCT_LABEL}) is not one whose "
                                  "memory this tool knows, and the node has no label " + MEMORY_LABEL,
                                  hint="pass --gpu-memory SIZE (or set gpu_memory), or label the node "
                                       f"{MEMORY_LABEL}=<MiB>")
            found[name] = (known, f"{PRODUCT_LABEL}={product}")
        else:
            unlabelled.append(name)
    if not found:
        return LabelledGpu(gpu_bytes=None, unlabelled=unlabelled)
    smallest, label = min(found.values())
    where = f"{len(found)} GPU node(s)" + (", the smallest" if len({b for b, _ in found.values()}) > 1 else "")
    return LabelledGpu(gpu_bytes=smallest, source=f"the nodes' label {label} ({where})", unlabelled=unlabelled)


# -- the model ----------------------------------------------------------------------------------------------------

class ModelShape(BaseModel):
    """The architecture facts of a recipe's Megatron model args that the accounting needs."""

    model_config = ConfigDict(frozen=True)

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_channels: int
    query_groups: int
    vocab: int
    vocab_divisible_by: int = 128
    swiglu: bool = False
    norm: int = 1  # 1 RMSNorm, 2 LayerNorm
    untied: bool = False
    experts: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    topk: int = 0
    moe_layers: int = 0
    last_layer_moe: bool = False
    mtp_layers: int = 0
    mla: tuple[int, int, int, int, int] | None = None  # q_lora_rank (0: none), kv_lora_rank, qk, qk_pos, v head dims


def _flags(args: Sequence[str]) -> dict[str, list[str]]:
    """Every ``--flag`` with its values (the last occurrence wins, as argparse does)."""
    out: dict[str, list[str]] = {}
    flag = None
    for a in args:
        if a.startswith("--"):
            flag = a
            out[flag] = []
        elif flag is not None:
            out[flag].append(a)
    return out


def _moe_pattern(text: str, layers: int) -> list[int]:
    """``--moe-layer-freq``: an int N (every N-th layer), a list literal, or Megatron's ``[0]*3+[1]*89`` form."""
    text = text.strip()
    if text.isdigit():
        n = int(text)
        return [1 if n and i % n == 0 else 0 for i in range(layers)]
    pattern: list[int] = []
    for term in text.split("+"):
        m = re.fullmatch(r"\s*(\[[0-9,\s]*\])\s*(?:\*\s*([0-9]+))?\s*", term)
        if not m:
            raise ValueError(f"--moe-layer-freq {text[:60]!r} is not a pattern this estimate reads")
        pattern += list(ast.literal_eval(m.group(1))) * int(m.group(2) or 1)
    if len(pattern) != layers:
        raise ValueError(f"--moe-layer-freq has {len(pattern)} entries for {layers} layers")
    return [1 if p else 0 for p in pattern]


def model_shape(recipe: Recipe) -> ModelShape:
    """The recipe's architecture from its model args; ConfigError (one line) when they are missing or unreadable."""
    f = _flags(recipe.model_args)

    def num(flag: str, default: int | None = None) -> int:
        values = f.get(flag)
        if values:
            return int(values[0])
        if default is None:
            raise ValueError(f"model args have no {flag}")
        return default

    if not recipe.model_args:
        raise ConfigError(f"recipe {recipe.name!r} has no model args: its memory cannot be estimated",
                          hint="add the Megatron model flags (upstream scripts/models/<type>.sh) as model_args in the "
                               "recipe file, or pass --no-memory-check")
    try:
        hidden, heads, layers = num("--hidden-size"), num("--num-attention-heads"), num("--num-layers")
        experts = num("--num-experts", 0)
        pattern = (_moe_pattern(f["--moe-layer-freq"][0], layers) if experts and f.get("--moe-layer-freq")
                   else [1 if experts else 0] * layers)
        mla = None
        if "--multi-latent-attention" in f:
            mla = (num("--q-lora-rank", 0), num("--kv-lora-rank"), num("--qk-head-dim"), num("--qk-pos-emb-head-dim"),
                   num("--v-head-dim"))
        shape = ModelShape(
            layers=layers, hidden=hidden, ffn=num("--ffn-hidden-size", 4 * hidden), heads=heads,
            kv_channels=num("--kv-channels", hidden // heads),
            query_groups=num("--num-query-groups", heads) if "--group-query-attention" in f else heads,
            vocab=num("--vocab-size"), vocab_divisible_by=num("--make-vocab-size-divisible-by", 128),
            swiglu="--swiglu" in f, norm=2 if (f.get("--normalization") or ["LayerNorm"])[0] == "LayerNorm" else 1,
            untied="--untie-embeddings-and-output-weights" in f, experts=experts,
            moe_ffn=num("--moe-ffn-hidden-size", num("--ffn-hidden-size", 4 * hidden)) if experts else 0,
            shared_ffn=num("--moe-shared-expert-intermediate-size", 0), topk=num("--moe-router-topk", 2 if experts else 0),
            moe_layers=sum(pattern), last_layer_moe=bool(pattern[-1]), mtp_layers=num("--mtp-num-layers", 0), mla=mla)
    except (ValueError, SyntaxError) as e:
        raise ConfigError(f"recipe {recipe.name!r}: its model args cannot be read for the memory estimate: {e}",
                          hint="fix model_args in the recipe file, or pass --no-memory-check") from None
    if min(shape.layers, shape.hidden, shape.heads, shape.vocab, shape.kv_channels) < 1:
        raise ConfigError(f"recipe {recipe.name!r}: its model args give a zero size", hint="fix model_args")
    return shape


class Parameters(BaseModel):
    """Parameter counts, split as Megatron places them. ``block_*``: the decoder layers (+ final norm);
    ``mtp_*``: the MTP layers (on the last stage); ``embedding``: one vocab x hidden matrix (the output layer is
    another when untied)."""

    block_dense: float
    block_experts: float
    mtp_dense: float
    mtp_experts: float
    embedding: float
    untied: bool
    source: str

    @property
    def total(self) -> int:
        return round(self.block_dense + self.block_experts + self.mtp_dense + self.mtp_experts
                     + self.embedding * (2 if self.untied else 1))


def padded_vocab(shape: ModelShape, tp: int) -> int:
    multiple = shape.vocab_divisible_by * tp
    return -(-shape.vocab // multiple) * multiple


def parameters(recipe: Recipe, shape: ModelShape | None = None, tp: int = 1) -> Parameters:
    """Megatron's count (theoretical_memory_usage.compute_weight_and_optimizer_memory), split into the parts that
    are sharded differently; scaled to :data:`PUBLISHED` for architectures the formula cannot see."""
    s = shape or model_shape(recipe)
    h = s.hidden
    if s.mla is not None:
        q_lora, kv_lora, qk, qk_pos, v = s.mla
        q = (q_lora * (h + s.heads * (qk + qk_pos) + s.norm) if q_lora else h * s.heads * (qk + qk_pos))
        attn = q + kv_lora * (h + s.heads * (qk + v) + s.norm) + h * qk_pos + s.heads * v * h
    else:
        q = s.kv_channels * s.heads
        attn = 2 * h * q * (1 + s.query_groups / s.heads)
    gated = 1.5 if s.swiglu else 1.0
    dense_layer = 2 * h * (s.ffn * gated + s.norm) + attn
    moe_rest = 2 * h * (s.shared_ffn * gated + s.norm) + attn
    moe_experts = 2 * h * s.moe_ffn * s.experts * gated
    n_moe, n_dense = s.moe_layers, s.layers - s.moe_layers
    block_dense = dense_layer * n_dense + moe_rest * n_moe + s.norm * h
    block_experts = moe_experts * n_moe
    mtp_dense = s.mtp_layers * (moe_rest if s.last_layer_moe else dense_layer)
    mtp_experts = s.mtp_layers * moe_experts if s.last_layer_moe else 0.0
    embedding = float(h * padded_vocab(s, tp))
    source = "Megatron's formula from the model args"
    published = PUBLISHED.get(recipe.megatron_model_type or "")
    if published is not None:
        target, where = published
        blocks = block_dense + block_experts + mtp_dense + mtp_experts
        scale = max(target - embedding * (2 if s.untied else 1), 0.05 * target) / blocks
        block_dense, block_experts, mtp_dense, mtp_experts = (x * scale for x in (block_dense, block_experts,
                                                                                  mtp_dense, mtp_experts))
        source = f"scaled to the published size ({where})"
    return Parameters(block_dense=block_dense, block_experts=block_experts, mtp_dense=mtp_dense,
                      mtp_experts=mtp_experts, embedding=embedding, untied=s.untied, source=source)


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


# -- what would fit instead ----------------------------------------------------------------------------------------

def _fits(recipe: Recipe, plan: Plan, known: dict, extra: Sequence[str]) -> bool:
    if not plan.feasible:
        return False
    try:
        return estimate(recipe, plan, extra_args=extra, **known).fits
    except ConfigError:
        return False


def suggestions(recipe: Recipe, plan: Plan, est: MemoryEstimate, extra_args: Sequence[str] = (),
                storage_capacity: int | None = None, limit: int = 3) -> list[str]:
    """Concrete changes that fit, each planned (feasible) and estimated (fits) before it is named: more nodes,
    another TP the recipe's heads allow (a recipe file), the optimizer on the CPU, fewer tokens per GPU, another
    SGLang memory fraction."""
    known = {"gpu_bytes": est.gpu_bytes, "memory_per_node": est.host.limit_bytes,
             "storage_capacity": storage_capacity}
    found: list[str] = []
    extra = list(extra_args)
    flags = job_flags(recipe, plan, extra)
    bad = {line.part for line in est.misfits()}

    def replan(nodes: int, r: Recipe = recipe) -> Plan:
        rollout_nodes = plan.rollout_nodes if plan.layout == "disaggregated" else None
        return plan_split(r, nodes, plan.gpus_per_node, plan.layout, rollout_nodes, None, with_suggestions=False)

    if bad & {"trainer", "host"}:
        for nodes in range(plan.nodes + 1, max(2 * plan.nodes, plan.nodes + 8) + 1):
            if _fits(recipe, replan(nodes), known, extra):
                found.append(f"--nodes {nodes}")
                break
        if not flags.optimizer_cpu_offload and "trainer" in bad and not flags.lora:
            more = [*extra, "--optimizer-cpu-offload"]
            if _fits(recipe, plan, known, more):
                found.append("--extra-args '--optimizer-cpu-offload'")
        if "trainer" in bad:
            tokens = flags.max_tokens_per_gpu
            while tokens > 512:
                tokens //= 2
                if _fits(recipe, plan, known, [*extra, "--max-tokens-per-gpu", str(tokens)]):
                    found.append(f"--extra-args '--max-tokens-per-gpu {tokens}'")
                    break
            for tp in (2 * recipe.tensor_parallel, 4 * recipe.tensor_parallel):
                if tp > 64 or recipe.attention_heads % tp:
                    continue
                try:
                    other = recipe.model_copy(update={"tensor_parallel": tp})
                    Recipe.model_validate(other.model_dump())
                except ValueError:
                    continue
                if _fits(other, replan(plan.nodes, other), known, extra):
                    found.append(f"tensor_parallel: {tp} in a recipe file (docs/recipes.md)")
                    break
    if bad & {"rollout", "trainer"}:
        for step in range(1, 10):
            for f in (flags.mem_fraction + 0.05 * step, flags.mem_fraction - 0.05 * step):
                if 0.1 <= f <= 0.95 and _fits(recipe, plan, known, [*extra, "--sglang-mem-fraction-static",
                                                                    f"{f:.2f}"]):
                    found.append(f"--extra-args '--sglang-mem-fraction-static {f:.2f}'")
                    break
            else:
                continue
            break
    return found[:limit + 1]


def misfit_line(recipe: Recipe, plan: Plan, est: MemoryEstimate, fixes: Sequence[str]) -> str:
    """ONE line: each part that does not fit with GiB needed and available, then the checked changes."""
    parts = "; ".join(f"{line.part} needs {line.needed_bytes / GIB:.1f} GiB{' per node' if line.part == 'host' else ''}"
                      f" but has {(line.available_bytes or 0) / GIB:.1f} GiB ({line.what})" for line in est.misfits())
    text = (f"{recipe.name} on {plan.nodes} x {plan.gpus_per_node} GPUs ({plan.layout}) does not fit: {parts}")
    if any("refuses to start" in n for n in est.notes):
        text += " (SGLang would refuse to start: no room for the KV cache)"
    bigger = {"trainer": "GPUs with more memory", "rollout": "GPUs with more memory",
              "host": "pods with more memory (memory_per_node)", "storage": "a larger claim or fewer kept checkpoints"}
    instead = " or ".join(dict.fromkeys(bigger[line.part] for line in est.misfits()))
    text += ("; fits with: " + " | ".join(fixes)) if fixes else f"; no checked change fits: use {instead}"
    return text + " (or --no-memory-check)"


def gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.1f}"


def fit_rows(est: MemoryEstimate) -> list[tuple[str, str, str, str]]:
    """The plan table's "fits" rows: part, GiB needed, GiB there, headroom."""
    rows = []
    for line in est.lines:
        head = line.headroom
        rows.append((line.part, gib(line.needed_bytes),
                     f"{gib(line.available_bytes)} ({line.what})" if line.available_bytes else line.what,
                     "-" if head is None else f"{head:.0%}"))
    return rows


# -- the check every verb that could spend a GPU hour runs ---------------------------------------------------------

class FitCheck(BaseModel):
    """The outcome of :func:`check_fit`: the estimate (None when the recipe has no model args and nothing asked
    for a check), whether it was checked, and the notices to print."""

    estimate: MemoryEstimate | None
    checked: bool
    notices: list[str] = Field(default_factory=list)


def known_limits(cfg: MilesRayConfig, gpu_bytes: int | None = None) -> tuple[int | None, int | None, str]:
    """What the configuration says is there: one GPU's memory (``gpu_bytes`` from the nodes' labels wins over
    nothing, ``gpu_memory`` over the labels), the pod's memory (only when ``memory_per_node`` was given: the
    default is what ``up`` would create, not what an existing cluster has), and where the GPU figure came from."""
    source = "node labels" if gpu_bytes else ""
    if cfg.gpu_memory:
        gpu_bytes, source = parse_size(cfg.gpu_memory, what="gpu_memory"), f"gpu_memory {cfg.gpu_memory}"
    host = _pod_memory(cfg.memory_per_node) if "memory_per_node" in cfg.model_fields_set else None
    return gpu_bytes, host, source


_K8S = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "k": 10**3, "M": 10**6,
        "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 10**-3}


def _pod_memory(text: str) -> int:
    """A Kubernetes memory quantity (``512Gi``, ``500G``) in bytes; the config validated its form."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", text.strip())
    if not m or m.group(2) not in _K8S:
        raise ConfigError(f"memory_per_node {text!r} is not a Kubernetes quantity such as 512Gi")
    return round(float(m.group(1)) * _K8S[m.group(2)])


def check_fit(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, extra_args: Sequence[str] = (), num_rollout: int | None = None,
              no_check: bool = False, gpu_bytes: int | None = None, keep_checkpoints: int | None = None,
              keep_best: bool = False) -> FitCheck:
    """Estimate and hold against what is known; a misfit is a PlanError (exit 2) in ONE line naming the part, the
    GiB needed and there, and the checked changes that fit. ``no_check``: estimate, say so, refuse nothing.
    ``keep_checkpoints`` / ``keep_best``: the run's retention (the storage part counts the checkpoints it keeps)."""
    gpu, host, source = known_limits(cfg, gpu_bytes)
    if not plan.feasible:
        return FitCheck(estimate=None, checked=False)
    try:
        est = estimate(recipe, plan, gpu_bytes=gpu, memory_per_node=host, extra_args=extra_args,
                       num_rollout=num_rollout, gpu_source=source, keep_checkpoints=keep_checkpoints,
                       keep_best=keep_best)
    except ConfigError:
        if no_check or (gpu is None and host is None):
            return FitCheck(estimate=None, checked=False, notices=[
                f"memory not estimated: recipe {recipe.name} has no Megatron model args"])
        raise
    notices = [] if gpu else ["GPU memory unknown: the GPU parts are estimated, not checked (pass --gpu-memory "
                              "SIZE or set gpu_memory)"]
    if no_check:
        return FitCheck(estimate=est, checked=False, notices=[
            "--no-memory-check: the memory estimate is not enforced" + ("" if est.fits else
                                                                           " (it says the job does NOT fit)")])
    if not est.fits:
        raise PlanError(misfit_line(recipe, plan, est, suggestions(recipe, plan, est, extra_args)))
    return FitCheck(estimate=est, checked=True, notices=notices)


def check_pod_fit(cfg: MilesRayConfig, recipe: Recipe, plan: Plan, no_check: bool = False) -> FitCheck:
    """``up``/``render``: a node's host memory against the pod these documents give it (``memory_per_node``, its
    default included: it is what the pod gets). The GPUs are not checked here (the documents do not say which);
    a recipe without model args is not estimated (nothing said: the cluster may run any job). A misfit is a
    PlanError in ONE line, as :func:`check_fit`'s; ``no_check``: estimated, said, not refused."""
    if not plan.feasible:
        return FitCheck(estimate=None, checked=False)
    try:
        est = estimate(recipe, plan, memory_per_node=_pod_memory(cfg.memory_per_node))
    except ConfigError:
        return FitCheck(estimate=None, checked=False)
    if no_check:
        return FitCheck(estimate=est, checked=False, notices=[] if est.fits else [
            "--no-memory-check: the memory estimate says the job does NOT fit the pods (not enforced)"])
    if not est.fits:
        raise PlanError(misfit_line(recipe, plan, est, suggestions(recipe, plan, est)))
    return FitCheck(estimate=est, checked=True)
