"""GPU memory sizes: ``--gpu-memory`` / ``gpu_memory`` parsed (a size or a product name), the memory of the GPU
products NVIDIA's GPU feature discovery (and AMD's labeller) name, and one GPU's memory from the GPU nodes' labels
(``nvidia.com/gpu.memory``, else ``nvidia.com/gpu.product``). Pure: no I/O (the labels are read by
miles_ray.adapters.kube.gpu_nodes)."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from miles_ray.core.errors import ConfigError

GIB = 2**30
MIB = 2**20

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
