"""The test clusters' toolchain: the pinned versions (cluster/versions.env), the cache of built binaries and
assets, and cluster/build.sh run when something is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from testbed import BUILD_SH, COMPONENTS, VERSIONS_FILE, FakeGPUError, ToolchainMissing, log_stderr

def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """KEY=VALUE lines of a versions file (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip().strip('"')
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("MILESRAY_TEST_CACHE", str(Path.home() / ".cache" / "miles-ray")))


def artifact_paths() -> dict[str, Path]:
    """Paths of the cached binaries and assets, as build.sh lays them out."""
    v = read_versions()
    bin_dir = cache_dir() / "bin"
    k8s = v["KUBERNETES_VERSION"]
    return {
        "etcd": bin_dir / f"etcd-{v['ETCD_VERSION']}",
        "kube-apiserver": bin_dir / f"kube-apiserver-{k8s}",
        "kube-controller-manager": bin_dir / f"kube-controller-manager-{k8s}",
        "kube-scheduler": bin_dir / f"kube-scheduler-{k8s}",
        "kwok": bin_dir / f"kwok-{v['KWOK_VERSION']}",
        "kuberay-operator": bin_dir / f"kuberay-operator-{v['KUBERAY_VERSION']}",
        "crds": cache_dir() / "crds" / f"kuberay-{v['KUBERAY_VERSION']}",
        "kwok-stages": cache_dir() / f"kwok-stages-{v['KWOK_VERSION']}.yaml",
    }


def all_cached() -> bool:
    p = artifact_paths()
    return all(
        (p[c].is_file() and os.access(p[c], os.X_OK)) for c in COMPONENTS
    ) and (p["crds"] / "ray.io_rayclusters.yaml").is_file() and p["kwok-stages"].is_file()


def find_go() -> str | None:
    """$GO if set (and executable), else go on PATH, else /usr/local/go/bin/go."""
    if os.environ.get("GO"):
        go = os.environ["GO"]
        return go if os.access(go, os.X_OK) else None
    go = shutil.which("go")
    if not go and os.access("/usr/local/go/bin/go", os.X_OK):
        go = "/usr/local/go/bin/go"
    return go


def ensure_built(log: Callable[[str], None] = log_stderr) -> dict[str, Any]:
    """Run build.sh unless everything is cached. Returns {"build_seconds": s} (0 if cached)."""
    if all_cached():
        return {"build_seconds": 0.0, "cached": True}
    go = find_go()
    if not go:
        raise ToolchainMissing(
            "the fake-GPU control plane binaries are not cached in "
            f"{cache_dir()} and no Go toolchain was found (PATH, $GO, /usr/local/go/bin/go) to build them"
        )
    env = dict(os.environ)
    env["GO"] = go
    env["PATH"] = f"{Path(go).parent}{os.pathsep}{env.get('PATH', '')}"
    log(f"building control plane binaries into {cache_dir()} (first run: many minutes) ...")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(BUILD_SH)], env=env, text=True, capture_output=True)
    sys.stderr.write(proc.stdout)
    if proc.returncode == 3:
        raise ToolchainMissing(proc.stderr.strip())
    if proc.returncode != 0:
        raise FakeGPUError(f"build.sh failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return {"build_seconds": time.monotonic() - t0, "cached": False}
