"""The model: its architecture from the recipe's Megatron model args and its parameter count, split as Megatron
places the parts (dense block, experts, MTP layers, embedding); hybrid architectures scaled to their published size.

Sources (read them; the code below is ours):

* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (``compute_weight_and_optimizer_memory``): the
  parameter count of a (grouped-query or multi-latent attention, dense or MoE, with MTP) GPT from its model args.
* Megatron-LM ``megatron/core/transformer/moe``: vocab padded to a multiple of ``make_vocab_size_divisible_by * TP``
  (``_vocab_size_with_padding``).
* Architectures the formula cannot express from the model args (hybrid linear-attention or Mamba layers, Gemma 4's
  layer types) are scaled to their published size (:data:`PUBLISHED`, each entry names where it is published).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from miles_ray.core.errors import ConfigError
from miles_ray.core.recipes import Recipe

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
