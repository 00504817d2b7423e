"""Real nodes (part of cluster/realnodes.py), what they run: the kubelet, Debian's runtime and the pod images
(cluster/build.sh), then the cached containerd template every node's root is a hard-linked copy of."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from realnodes_plan import BUILD_SH, IMAGE_PY, TEMPLATE_FORMAT, RealNodesError, tail


def artifact_paths(fg: ModuleType) -> dict[str, Path]:
    v = fg.read_versions()
    cache = fg.cache_dir()
    return {
        "kubelet": cache / "bin" / f"kubelet-{v['KUBERNETES_VERSION']}",
        "ray-image": Path(_image_spec("ray", cache)["tar"]),
        "pause-image": Path(_image_spec("pause", cache)["tar"]),
        "polyaxon-image": Path(_image_spec("polyaxon", cache)["tar"]),
    }


def _image_module() -> ModuleType:
    import importlib.util

    name = "miles_ray_build_image"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, IMAGE_PY)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _image_spec(kind: str, cache: Path) -> dict[str, str]:
    return _image_module().image_spec(kind, cache)


def runtime_missing() -> list[str]:
    """Runtime binaries real nodes need that are not on this machine."""
    need = ["containerd", "containerd-shim-runc-v2", "ctr", "runc", "nsenter", "unshare", "ip", "mount"]
    missing = [b for b in need if not shutil.which(b)]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge")
    return missing


def ensure_built(fg: ModuleType, log: Callable[[str], None]) -> dict[str, float]:
    """Run ``build.sh real-nodes`` unless all is there, then make the containerd template."""
    timings: dict[str, float] = {}
    p = artifact_paths(fg)
    cached = (os.access(p["kubelet"], os.X_OK) and p["ray-image"].is_file() and p["pause-image"].is_file()
              and not runtime_missing())
    if not cached:
        go = fg.find_go()
        if not os.access(p["kubelet"], os.X_OK) and not go:
            raise fg.ToolchainMissing(f"the kubelet is not cached in {fg.cache_dir()} and no Go toolchain was found")
        env = dict(os.environ, PYTHON=sys.executable, MILESRAY_TEST_CACHE=str(fg.cache_dir()))
        if go:
            env["GO"] = go
            env["PATH"] = f"{Path(go).parent}{os.pathsep}{env.get('PATH', '')}"
        log("building what real nodes need (kubelet, Debian runtime, images; first run: many minutes) ...")
        t = time.monotonic()
        proc = subprocess.run(["bash", str(BUILD_SH), "real-nodes"], env=env, text=True, capture_output=True)
        sys.stderr.write(proc.stdout)
        if proc.returncode == 3:
            raise fg.ToolchainMissing(proc.stderr.strip())
        if proc.returncode != 0:
            raise RealNodesError(f"build.sh real-nodes failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        timings["build"] = time.monotonic() - t
    if not p["polyaxon-image"].is_file():  # Polyaxon's init + sidecar image (build.sh knows ray and pause only)
        log("building Polyaxon's init + sidecar image (first run: ~1-2 min) ...")
        t = time.monotonic()
        proc = subprocess.run([sys.executable, str(IMAGE_PY), "polyaxon", "--cache", str(fg.cache_dir())],
                              text=True, capture_output=True)
        if proc.returncode != 0:
            raise RealNodesError(f"build_image.py polyaxon failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        timings["polyaxon-image"] = time.monotonic() - t
    t = time.monotonic()
    ensure_template(fg, log)
    timings["template"] = time.monotonic() - t
    return timings


def containerd_config(root: Path, state: Path, sock: Path, sandbox_image: str, cni_conf: Path | None) -> str:
    """containerd 1.6 config (version 2): own socket/root/state, cgroupfs, overlayfs, CRI settings
    this VM needs (no CAP_SYS_RESOURCE: restrict_oom_score_adj; pod netns under the state dir)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f'root = "{root}"',
        f'state = "{state}"',
        "oom_score = 0",
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",'
        ' "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]',
        "[grpc]",
        f'  address = "{sock}"',
        "[metrics]",
        '  address = ""',
        f"[{cri}]",
        f'  sandbox_image = "{sandbox_image}"',
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  disable_apparmor = true",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "  enable_selinux = false",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f'  Root = "{state}/runc"',
        f"[{cri}.cni]",
        '  bin_dir = "/usr/lib/cni"',
        f'  conf_dir = "{cni_conf or (state / "no-cni")}"',
        "  max_conf_num = 1",
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{root}/opt"',
    ]
    return "\n".join(lines) + "\n"


def ctr(sock: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args],
                          text=True, capture_output=True, timeout=timeout)


def _wait_socket(sock: Path, proc: subprocess.Popen, what: str, log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RealNodesError(f"{what} exited (rc={proc.returncode}):\n{tail(log_path)}")
        if sock.exists() and ctr(sock, "version", timeout=10).returncode == 0:
            return
        time.sleep(0.2)
    raise RealNodesError(f"timed out waiting for {what} at {sock}:\n{tail(log_path)}")


def template_dir(fg: ModuleType) -> Path:
    v = fg.read_versions()
    cache = fg.cache_dir()
    key = hashlib.sha256("\n".join([
        TEMPLATE_FORMAT, v["CONTAINERD_DEB_VERSION"], _image_spec("ray", cache)["key"],
        _image_spec("pause", cache)["key"], _image_spec("polyaxon", cache)["key"],
    ]).encode()).hexdigest()[:16]
    return cache / "containerd" / key


def ensure_template(fg: ModuleType, log: Callable[[str], None]) -> dict[str, Any]:
    """A containerd root holding both images, imported once and cached (``template.json`` lists the
    image references with their digests). Each node's root is a hard-linked copy of it."""
    tdir = template_dir(fg)
    meta_file = tdir / "template.json"
    if meta_file.is_file():
        return json.loads(meta_file.read_text())
    tdir.parent.mkdir(parents=True, exist_ok=True)
    with open(tdir.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if meta_file.is_file():
            return json.loads(meta_file.read_text())
        cache = fg.cache_dir()
        images = {k: _image_spec(k, cache) for k in ("pause", "ray", "polyaxon")}
        work = tdir.parent / f"{tdir.name}.tmp{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "state").mkdir(parents=True)
        sock = work / "c.sock"
        cfg = work / "config.toml"
        cfg.write_text(containerd_config(work / "root", work / "state", sock, images["pause"]["tag"], None))
        log_path = work / "containerd.log"
        t0 = time.monotonic()
        # A private mount namespace (tmpfs on /run for containerd's fixed paths): nothing of the
        # unpacking reaches the machine's mount table.
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 'mount -t tmpfs -o mode=0755 milesray-run /run && exec containerd --config "$0"', str(cfg)],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_socket(sock, proc, "template containerd", log_path)
            out: dict[str, Any] = {"images": {}}
            for kind, spec in images.items():
                t = time.monotonic()
                r = ctr(sock, "images", "import", spec["tar"], timeout=900)
                if r.returncode != 0:
                    raise RealNodesError(f"ctr images import {spec['tar']}: {r.stderr.strip()}")
                out["images"][kind] = {"tag": spec["tag"], "import_seconds": round(time.monotonic() - t, 1)}
            for kind, spec in images.items():
                r = ctr(sock, "images", "ls")
                r_ls = r.stdout
                for line in r.stdout.splitlines():
                    f = line.split()
                    if f and f[0] == spec["tag"]:
                        digest = next(x for x in f if x.startswith("sha256:"))
                        out["images"][kind]["digest"] = digest
                        repo = spec["tag"].rsplit(":", 1)[0]
                        out["images"][kind]["ref"] = f"{spec['tag']}@{digest}"
                        out["images"][kind]["repo_digest"] = f"{repo}@{digest}"
                if "digest" not in out["images"][kind]:
                    raise RealNodesError(f"{spec['tag']} is not listed after import:\n{r.stdout}")
                # The digest-pinned reference pods use (repo:tag@sha256:...) resolves in the CRI
                # through an image named repo@sha256:... (what a CRI pull records; ctr import does not).
                r = ctr(sock, "images", "tag", spec["tag"], out["images"][kind]["repo_digest"])
                if r.returncode != 0:
                    raise RealNodesError(f"ctr images tag {out['images'][kind]['repo_digest']}: {r.stderr.strip()}")
                # An archive of several images (Polyaxon's init and sidecar: one layer, two configs): the others
                # were imported with it, under their own names.
                for extra in (spec.get("tags") or "").split()[1:]:
                    if not any(line.split()[:1] == [extra] for line in r_ls.splitlines()):
                        raise RealNodesError(f"{extra} is not listed after importing {spec['tar']}")
                    out["images"][kind].setdefault("also", []).append(extra)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["containerd"] = fg.read_versions()["CONTAINERD_DEB_VERSION"]
        tdir_tmp = work / "root"
        shutil.rmtree(tdir, ignore_errors=True)
        tdir.mkdir()
        tdir_tmp.rename(tdir / "root")
        meta_file.write_text(json.dumps(out, indent=2) + "\n")
        shutil.rmtree(work, ignore_errors=True)
        log(f"containerd template with the pod and sandbox images made in {out['seconds']:.0f}s: {tdir}")
        return out


def copy_root(template_root: Path, dest: Path) -> None:
    """A node's containerd root from the template: immutable content blobs and committed snapshot
    trees hard-linked (instant, no extra disk), everything containerd writes to copied."""
    linked = {"io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots"}
    dest.mkdir(parents=True)
    for top in template_root.iterdir():
        if top.is_dir():
            (dest / top.name).mkdir()
            for sub in top.iterdir():
                rel = f"{top.name}/{sub.name}"
                flag = "-al" if rel in linked else "-a"
                subprocess.run(["cp", flag, str(sub), str(dest / top.name / sub.name)], check=True)
        else:
            subprocess.run(["cp", "-a", str(top), str(dest / top.name)], check=True)
