"""What every part of the test clusters shares (cluster/fakegpu.py, cluster/realnodes.py and their helpers): where
they live, the control plane's fixed addresses and components, its errors, and the state file of a cluster's dir."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"
BUILD_SH = HERE / "build.sh"
DEFAULT_DIR = Path(os.environ.get("MILESRAY_TEST_FAKEGPU_DIR", "/tmp/miles-ray-fakegpu"))
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"
FAKE_GPU_MEMORY_MIB = "81559"  # nvidia.com/gpu.memory of the fake GPU nodes (MiB, an H100 80GB's)
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.1/16"

# Start order; ``down`` stops in reverse order.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kuberay-operator")


class FakeGPUError(RuntimeError):
    """The control plane could not be started or checked."""


class ToolchainMissing(FakeGPUError):
    """Binaries are not cached and there is no Go toolchain to build them."""


def log_stderr(msg: str) -> None:
    print(f"[fakegpu] {msg}", file=sys.stderr, flush=True)


def read_state(d: Path) -> dict[str, Any] | None:
    """The state file of a cluster's dir (None: none, or unreadable)."""
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return None


def write_state(d: Path, state: dict[str, Any]) -> None:
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(d / "state.json")


def remove_paths(d: Path, names: tuple[str, ...]) -> None:
    """Remove each of ``names`` under ``d`` (a directory with its contents, or a file) if it is there."""
    for sub in names:
        p = d / sub
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
