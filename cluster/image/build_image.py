#!/usr/bin/env python3
"""Build the real nodes' container images without a registry, as docker-archive tars.

    python cluster/image/build_image.py ray   --cache DIR   # the pod image: Debian + Ray
    python cluster/image/build_image.py pause --cache DIR --pause-c PATH
    python cluster/image/build_image.py polyaxon --cache DIR  # Polyaxon's init + sidecar image
    python cluster/image/build_image.py path ray|pause|polyaxon --cache DIR  # where the cached tar is (or would be)

ray:   ``mmdebstrap`` of a Debian suite (minbase) with the packages of ``IMAGE_PACKAGES``
       (versions.env), a venv at ``/opt/ray`` (on PATH, also for the login shells KubeRay starts)
       with ``ray[default]`` at the version the repository's constraints.txt pins, installed
       offline from wheels that the host's pip downloads (every other pin of constraints.txt
       applies as a constraint). No network inside the chroot.
polyaxon: the image of the init containers and the ``polyaxon-sidecar`` container that Polyaxon's agent
       puts in every pod it makes: the same Debian base with a venv at ``/opt/polyaxon`` (on PATH) holding
       ``polyaxon[fsspec,sidecar,k8s-async,init]`` at ``POLYAXON_VERSION`` of polyaxon-versions.env, under
       constraints.txt. One rootfs (one layer) with two image configs, under the names the agent's converter
       uses (``polyaxon/polyaxon-init:<v>``, ``polyaxon/polyaxon-sidecar:<v>``, ``IfNotPresent``): the
       converter runs ``polyaxon sidecar ...`` / ``polyaxon initializer ...`` without ``POLYAXON_SERVICE``,
       and the CLI only offers those commands when it is set, so each config sets it (as Polyaxon's own
       images do).
pause: the sandbox image, ``pause.c`` from the k8s.io/kubernetes module compiled with
       ``gcc -static`` (what containerd's ``sandbox_image`` points at).

Each tar is a docker-archive (``manifest.json``, one config, one uncompressed layer) written by
the small stdlib writer below, for ``ctr images import``. Cached under ``<cache>/images/`` by a
hash of every input (this file, the image lines of versions.env, constraints.txt): an unchanged
input set is never rebuilt. A JSON sidecar ``<tar>.json`` records the tag, the input hash, the
size and the build time. Stdlib only; mmdebstrap runs in a private mount namespace
(``unshare --mount``) so that its mounts never reach the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

HERE = Path(__file__).resolve().parent
CLUSTER = HERE.parent
REPO = CLUSTER.parent
VERSIONS_FILE = CLUSTER / "versions.env"
POLYAXON_VERSIONS_FILE = CLUSTER / "polyaxon-versions.env"
POLYAXON_VENV = "/opt/polyaxon"
POLYAXON_EXTRAS = "fsspec,sidecar,k8s-async,init"
CONSTRAINTS = REPO / "constraints.txt"
EPOCH = "1970-01-01T00:00:00Z"
RAY_VENV = "/opt/ray"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """KEY=VALUE lines of versions.env (the same parsing as cluster/fakegpu.py)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip().strip('"')
    return out


def ray_version() -> str:
    """The ray pin of constraints.txt (the one Ray version of the project)."""
    for line in CONSTRAINTS.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.strip().lower() == "ray":
            return version.strip()
    raise SystemExit(f"build_image.py: no ray== pin in {CONSTRAINTS}")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


def image_spec(kind: str, cache: Path) -> dict[str, str]:
    """``{"tar", "tag", "key"}`` of an image: where it is cached and the name it is imported as."""
    v = read_versions()
    images = cache / "images"
    me = Path(__file__).read_bytes()
    if kind == "ray":
        inputs = [me, CONSTRAINTS.read_bytes()] + [
            f"{k}={v[k]}".encode() for k in ("IMAGE_DEBIAN_SUITE", "IMAGE_DEBIAN_MIRROR", "IMAGE_PACKAGES")
        ]
        key = _digest(*inputs)[:16]
        rv = ray_version()
        return {"tar": str(images / f"ray-{rv}-{key}.tar"), "tag": f"milesray.local/ray:{rv}-{key}", "key": key}
    if kind == "pause":
        key = _digest(me, v["KUBERNETES_VERSION"].encode(), v["PAUSE_VERSION"].encode())[:16]
        return {
            "tar": str(images / f"pause-{v['PAUSE_VERSION']}-{key}.tar"),
            "tag": f"milesray.local/pause:{v['PAUSE_VERSION']}-{key}",
            "key": key,
        }
    if kind == "polyaxon":
        pv = read_versions(POLYAXON_VERSIONS_FILE)["POLYAXON_VERSION"]
        key = _digest(me, CONSTRAINTS.read_bytes(), pv.encode(), POLYAXON_EXTRAS.encode(), *[
            f"{k}={v[k]}".encode() for k in ("IMAGE_DEBIAN_SUITE", "IMAGE_DEBIAN_MIRROR", "IMAGE_PACKAGES")])[:16]
        return {"tar": str(images / f"polyaxon-{pv}-{key}.tar"), "key": key, "version": pv,
                # the names the agent's converter gives the init and sidecar containers (docker.io implied)
                "tag": f"docker.io/polyaxon/polyaxon-init:{pv}",
                "tags": f"docker.io/polyaxon/polyaxon-init:{pv} docker.io/polyaxon/polyaxon-sidecar:{pv}"}
    raise SystemExit(f"build_image.py: unknown image {kind!r} (ray, pause or polyaxon)")


# --------------------------------------------------------------------------------------------
# docker-archive writer


class _HashingReader(io.RawIOBase):
    """Reads a file and hashes what it hands out (so the layer is read once)."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        self.sha.update(data)
        b[: len(data)] = data
        return len(data)


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))


def write_docker_archive(dest: Path, layer: Path, tag: str, container_config: dict[str, Any]) -> dict[str, Any]:
    """One-layer docker-archive at ``dest``: ``layers/0.tar`` (``layer`` as is), the image config
    and ``manifest.json``. Layer first (hashed while copied), then config and manifest, which
    containerd's importer accepts in any order."""
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out, layer.open("rb") as f:
        info = tarfile.TarInfo("layers/0.tar")
        info.size = layer.stat().st_size
        info.mode = 0o644
        reader = _HashingReader(f)
        out.addfile(info, io.BufferedReader(reader, 1 << 20))
        diff_id = f"sha256:{reader.sha.hexdigest()}"
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": EPOCH,
            "config": container_config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": EPOCH, "created_by": "cluster/image/build_image.py"}],
        }
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
        _add_bytes(out, config_name, config_bytes)
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layers/0.tar"]}]
        _add_bytes(out, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(dest)
    return {"diff_id": diff_id, "config": config_name}


def _finish(spec: dict[str, str], layer: Path, container_config: dict[str, Any], t0: float) -> None:
    dest = Path(spec["tar"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    meta = write_docker_archive(dest, layer, spec["tag"], container_config)
    meta.update(
        tag=spec["tag"], key=spec["key"], bytes=dest.stat().st_size, build_seconds=round(time.monotonic() - t0, 1),
        built=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    Path(f"{dest}.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{spec['tag']} {dest} ({meta['bytes'] / 2**20:.0f} MiB, {meta['build_seconds']:.0f}s)")


# --------------------------------------------------------------------------------------------
# Images


def build_pause(spec: dict[str, str], pause_c: Path) -> None:
    t0 = time.monotonic()
    v = read_versions()
    with tempfile.TemporaryDirectory(prefix="milesray-pause-") as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run(
            ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{v['PAUSE_VERSION']}-milesray",
             "-o", str(binary), str(pause_c)],
            check=True,
        )
        subprocess.run(["strip", str(binary)], check=True)
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
            info = t.gettarinfo(str(binary), "pause")
            info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = 0o755, 0, 0, "", "", 0
            with binary.open("rb") as f:
                t.addfile(info, f)
        _finish(spec, layer, {"Entrypoint": ["/pause"], "User": "65535:65535"}, t0)


def build_ray(spec: dict[str, str], python: str) -> None:
    t0 = time.monotonic()
    v = read_versions()
    rv = ray_version()
    if not shutil.which("mmdebstrap"):
        raise SystemExit("build_image.py: mmdebstrap is missing (cluster/build.sh node-runtime installs it)")
    images = Path(spec["tar"]).parent
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ray-image-", dir=images) as tmp:
        wheels = Path(tmp) / "wheels"
        t = time.monotonic()
        # Wheels for the image's Python (bookworm's 3.11) from the host's pip: the registry is reached
        # the usual way, with the host's pip configuration; the chroot then installs offline.
        subprocess.run(
            [python, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
             "--python-version", "3.11", "--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64",
             "--implementation", "cp", "-c", str(CONSTRAINTS), f"ray[default]=={rv}"],
            check=True,
        )
        shutil.copy(CONSTRAINTS, wheels / "constraints.txt")
        print(f"wheels downloaded in {time.monotonic() - t:.0f}s", file=sys.stderr)
        chroot_env = f"env -i PATH={BASE_PATH} HOME=/root LANG=C.UTF-8"
        profile = (f'case ":$PATH:" in *":{RAY_VENV}/bin:"*) ;; *) PATH="{RAY_VENV}/bin:$PATH"; export PATH ;; esac\n')
        hooks = [
            f'mkdir -p "$1/tmp/wheels" && cp -a {wheels}/. "$1/tmp/wheels/"',
            f'chroot "$1" {chroot_env} python3 -m venv {RAY_VENV}',
            f'chroot "$1" {chroot_env} {RAY_VENV}/bin/pip install --quiet --no-index --no-cache-dir '
            f'--find-links /tmp/wheels -c /tmp/wheels/constraints.txt "ray[default]=={rv}"',
            f'rm -rf "$1/tmp/wheels"',
            # Bytecode that stays valid in the image: the image's files get mtime 0 (SOURCE_DATE_EPOCH), so
            # the timestamp-based .pyc that pip and Debian wrote no longer match their sources and every
            # Python process in a pod (ray start, raylet workers, dashboard, agents, job drivers) would
            # compile what it imports again, and again (PYTHONDONTWRITEBYTECODE). Hash-based .pyc do not
            # depend on mtimes.
            f'chroot "$1" {chroot_env} {RAY_VENV}/bin/python -m compileall -q -f -j0 --invalidation-mode '
            f'checked-hash {RAY_VENV}/lib /usr/lib/python3.11 >/dev/null',
            # KubeRay starts Ray with `bash -lc`: /etc/profile resets PATH, so put the venv back on it.
            f"printf '%s' '{profile}' > \"$1/etc/profile.d/ray.sh\"",
            f'chroot "$1" {chroot_env} {RAY_VENV}/bin/python -c "import ray, ray.dashboard; print(ray.__version__)"',
            # Nothing of the build machine in the image: its resolver and hostname were copied in
            # for apt (the runtime mounts the pod's own files over both).
            ': > "$1/etc/resolv.conf"',
            'echo localhost > "$1/etc/hostname"',
        ]
        rootfs = Path(tmp) / "rootfs.tar"
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                "mmdebstrap", "--quiet", "--mode=root", "--variant=minbase", "--format=tar",
                f"--include={v['IMAGE_PACKAGES']}"]
        argv += [f"--customize-hook={h}" for h in hooks]
        argv += [v["IMAGE_DEBIAN_SUITE"], str(rootfs), v["IMAGE_DEBIAN_MIRROR"]]
        t = time.monotonic()
        env = dict(os.environ, SOURCE_DATE_EPOCH="0")
        subprocess.run(argv, check=True, env=env)
        print(f"rootfs built in {time.monotonic() - t:.0f}s", file=sys.stderr)
        _finish(spec, rootfs, {
            "Env": [f"PATH={RAY_VENV}/bin:{BASE_PATH}", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"],
            "Cmd": ["/bin/bash"],
            "WorkingDir": "/",
        }, t0)


def build_polyaxon(spec: dict[str, str], python: str) -> None:
    """Polyaxon's init + sidecar image (see the module docstring): built like the Ray image, its own function
    so the two never touch each other's steps."""
    t0 = time.monotonic()
    v = read_versions()
    pv = spec["version"]
    if not shutil.which("mmdebstrap"):
        raise SystemExit("build_image.py: mmdebstrap is missing (cluster/build.sh node-runtime installs it)")
    images = Path(spec["tar"]).parent
    images.mkdir(parents=True, exist_ok=True)
    req = f"polyaxon[{POLYAXON_EXTRAS}]=={pv}"
    with tempfile.TemporaryDirectory(prefix="polyaxon-image-", dir=images) as tmp:
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [python, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
             "--python-version", "3.11", "--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64",
             "--implementation", "cp", "-c", str(CONSTRAINTS), req],
            check=True,
        )
        shutil.copy(CONSTRAINTS, wheels / "constraints.txt")
        chroot_env = f"env -i PATH={BASE_PATH} HOME=/root LANG=C.UTF-8"
        hooks = [
            f'mkdir -p "$1/tmp/wheels" && cp -a {wheels}/. "$1/tmp/wheels/"',
            f'chroot "$1" {chroot_env} python3 -m venv {POLYAXON_VENV}',
            f'chroot "$1" {chroot_env} {POLYAXON_VENV}/bin/pip install --quiet --no-index --no-cache-dir '
            f'--find-links /tmp/wheels -c /tmp/wheels/constraints.txt "{req}"',
            f'rm -rf "$1/tmp/wheels"',
            f'chroot "$1" {chroot_env} {POLYAXON_VENV}/bin/python -m compileall -q -f -j0 --invalidation-mode '
            f'checked-hash {POLYAXON_VENV}/lib >/dev/null',
            # the converter's commands are `polyaxon ...` run by /bin/sh -c or directly: on every PATH
            f'ln -s {POLYAXON_VENV}/bin/polyaxon "$1/usr/local/bin/polyaxon"',
            f'chroot "$1" {chroot_env} HOME=/tmp POLYAXON_SERVICE=sidecar polyaxon sidecar --help >/dev/null',
            f'chroot "$1" {chroot_env} HOME=/tmp POLYAXON_SERVICE=initializer polyaxon initializer --help >/dev/null',
            ': > "$1/etc/resolv.conf"',
            'echo localhost > "$1/etc/hostname"',
        ]
        rootfs = Path(tmp) / "rootfs.tar"
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                "mmdebstrap", "--quiet", "--mode=root", "--variant=minbase", "--format=tar",
                f"--include={v['IMAGE_PACKAGES']}"]
        argv += [f"--customize-hook={h}" for h in hooks]
        argv += [v["IMAGE_DEBIAN_SUITE"], str(rootfs), v["IMAGE_DEBIAN_MIRROR"]]
        subprocess.run(argv, check=True, env=dict(os.environ, SOURCE_DATE_EPOCH="0"))
        env = [f"PATH={POLYAXON_VENV}/bin:{BASE_PATH}", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"]
        init_tag, sidecar_tag = spec["tags"].split()
        dest = Path(spec["tar"])
        meta = write_docker_archive_configs(dest, rootfs, [
            (init_tag, {"Env": env + ["POLYAXON_SERVICE=initializer"], "Cmd": ["/bin/bash"], "WorkingDir": "/"}),
            (sidecar_tag, {"Env": env + ["POLYAXON_SERVICE=sidecar"], "Cmd": ["/bin/bash"], "WorkingDir": "/"}),
        ])
        meta.update(tag=spec["tag"], tags=spec["tags"], key=spec["key"], bytes=dest.stat().st_size,
                    build_seconds=round(time.monotonic() - t0, 1),
                    built=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        Path(f"{dest}.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"{spec['tags']} {dest} ({meta['bytes'] / 2**20:.0f} MiB, {meta['build_seconds']:.0f}s)")


def write_docker_archive_configs(dest: Path, layer: Path, images: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A docker-archive at ``dest`` with ONE layer and one image config per ``(tag, container_config)``: several
    images that differ only in their config (environment), stored once."""
    tmp = dest.with_suffix(".tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out, layer.open("rb") as f:
        info = tarfile.TarInfo("layers/0.tar")
        info.size = layer.stat().st_size
        info.mode = 0o644
        reader = _HashingReader(f)
        out.addfile(info, io.BufferedReader(reader, 1 << 20))
        diff_id = f"sha256:{reader.sha.hexdigest()}"
        manifest, configs = [], []
        for tag, container_config in images:
            config = {
                "architecture": "amd64", "os": "linux", "created": EPOCH, "config": container_config,
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created": EPOCH, "created_by": "cluster/image/build_image.py"}],
            }
            config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
            config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
            _add_bytes(out, config_name, config_bytes)
            manifest.append({"Config": config_name, "RepoTags": [tag], "Layers": ["layers/0.tar"]})
            configs.append(config_name)
        _add_bytes(out, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(dest)
    return {"diff_id": diff_id, "configs": configs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build_image.py", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["ray", "pause", "polyaxon", "path"])
    p.add_argument("image", nargs="?", choices=["ray", "pause", "polyaxon"], help="with 'path': which image")
    p.add_argument("--cache", type=Path, required=True, help="the binary cache (cluster/build.sh passes its own)")
    p.add_argument("--pause-c", type=Path, help="pause.c of the k8s.io/kubernetes module")
    p.add_argument("--python", default=sys.executable, help="Python whose pip downloads the wheels")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    a = p.parse_args(argv)
    if a.what == "path":
        if not a.image:
            p.error("path needs ray, pause or polyaxon")
        spec = image_spec(a.image, a.cache)
        print(f"{spec['tar']} {spec['tag']}")
        return 0
    spec = image_spec(a.what, a.cache)
    if Path(spec["tar"]).is_file() and not a.force:
        print(f"{spec['tag']} {spec['tar']} (cached)")
        return 0
    if a.what == "pause":
        if not a.pause_c:
            p.error("pause needs --pause-c")
        build_pause(spec, a.pause_c)
    elif a.what == "polyaxon":
        build_polyaxon(spec, a.python)
    else:
        build_ray(spec, a.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
