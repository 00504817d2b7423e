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

One module a topic; their public names are importable from here: :mod:`.gpu` (sizes, the GPU product table, the
GPU nodes' labels), :mod:`.model` (the parameter count from the Megatron model args, the published sizes of hybrid
models), :mod:`.estimate` (the job's flags, the trainer/rollout/host/storage estimate and its result models) and
:mod:`.fit` (the check every verb runs: check_fit, the misfit line, the checked suggestions, the plan table's rows).
"""

from __future__ import annotations

from miles_ray.core.memory.estimate import FitLine, MemoryEstimate, estimate
from miles_ray.core.memory.fit import check_fit, check_pod_fit, fit_rows, gib, known_limits, misfit_line, suggestions
from miles_ray.core.memory.gpu import (GIB, MEMORY_LABEL, MIB, PRODUCT_LABEL, LabelledGpu, gpu_memory_from_labels,
                                       parse_size)
from miles_ray.core.memory.model import PUBLISHED, parameters

__all__ = ["GIB", "MEMORY_LABEL", "MIB", "PRODUCT_LABEL", "PUBLISHED", "FitLine", "LabelledGpu", "MemoryEstimate",
           "check_fit", "check_pod_fit", "estimate", "fit_rows", "gib", "gpu_memory_from_labels", "known_limits",
           "misfit_line", "parameters", "parse_size", "suggestions"]
