"""Real nodes for the fake-GPU control plane: real kubelets, each with its own containerd, running real pods.

Used by ``cluster/fakegpu.py up --real-nodes N`` (see cluster/README.md, "Real nodes"); not a command
of its own. fakegpu hands itself in (``fg``) for its versions, cache, process and API helpers.

Layout, all inside ONE network namespace that ``up`` creates (``unshare --net``, held by a
``sleep`` process; nothing is added to the machine's own network configuration):

- the control plane (etcd, kube-apiserver, controllers, scheduler, kwok, KubeRay operator), on
  127.0.0.1 of that namespace;
- the node IPs (198.18.0.10, .11, ...) and the DNS stub's address (198.18.0.2) on the namespace's
  loopback interface (this kernel has no dummy interfaces) — the 198.18.0.0/15 benchmarking range,
  which exists only in here;
- per node: one bridge ``mrbr<i>`` with the pod subnet 198.19.<i>.0/24 (CNI bridge + host-local);
- ``dnsstub.py``: the only resolver pods know (kubelet ``clusterDNS``, ``resolvConf: ""``);
- ``nsrelay.py``: the one thing in the machine's namespace, listening on the machine's 127.0.0.1
  at the control plane's ports and connecting inside (how the tests, kubectl and fakegpu's own
  health checks reach the apiserver: same URL inside and out).

Per node (``real-cpu-<i>`` for the Ray head, ``real-gpu-<i>`` advertising ``nvidia.com/gpu``):

- its own mount namespace (``unshare --mount``, held by a ``sleep``), with tmpfs over /run,
  /var/lib and /var/log and files bind-mounted over the /proc/sys entries the kubelet writes
  (``vm.overcommit_memory``, ``vm.panic_on_oom``, ``kernel.panic``, ``kernel.panic_on_oops``,
  ``kernel.keys.root_max*``): every mount containerd, runc and the kubelet make stays in there
  and vanishes with it, and the machine's sysctls keep their values;
- its own containerd (Debian's 1.6, own socket/root/state, cgroupfs, overlayfs), its root a
  hard-linked copy of a cached template that already holds the imported pod and sandbox images
  (so a warm start imports nothing);
- its own kubelet (built from k8s.io/kubernetes), node IP, ports, root dir and cgroup root
  ``<memory cgroup of the caller>/milesray-<run>/<node>`` (kubelet, containerd and the shims in
  ``.../runtime``, pods in ``.../kubepods``), client certificate ``system:node:<name>``.

``down`` deletes the pods' containers through ``ctr``, stops kubelet and containerd by PID,
kills whatever is left in the node's cgroups or mount namespace by PID, removes the cgroups, and
finally stops the DNS stub, the relay and the namespace holder; ``leftovers()`` then proves
nothing remains (process, mount, cgroup, namespace).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
NSRELAY_PY = HERE / "nsrelay.py"
DNSSTUB_PY = HERE / "dnsstub.py"
IMAGE_PY = HERE / "image" / "build_image.py"
BUILD_SH = HERE / "build.sh"

DNS_IP = "198.18.0.2"
#: The in-cluster API address (the ``kubernetes`` Service: first address of fakegpu's SERVICE_CIDR), on the
#: namespace's loopback and relayed to the apiserver, since no kube-proxy serves Service addresses here.
KUBERNETES_SERVICE_IP = "10.96.0.1"
#: Where pods reach servers the tests run on the machine (``relay_out``): an address of the namespace's
#: loopback whose listeners connect to the machine's 127.0.0.1, one port each.
MACHINE_IP = "198.18.0.3"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
GPU_RESOURCE = "nvidia.com/gpu"
REAL_NODE_LABEL = "milesray.io/real-node"
# What the kubelet writes on start (setupKernelTunables); covered per node so the machine keeps its values.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)
# Machine sysctls a real-pod cluster could plausibly touch: checked unchanged by the tests.
HOST_SYSCTLS = KUBELET_SYSCTLS + (
    "net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding",
    "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
    "kernel/pid_max", "fs/inotify/max_user_instances", "fs/inotify/max_user_watches",
)
# Mount points covered by tmpfs in every node's mount namespace (fixed paths of containerd, the CNI
# plugins and the kubelet: /run/containerd, /var/lib/cni, /var/log/containers, ...).
NODE_TMPFS = ("/run", "/var/lib", "/var/log")
TEMPLATE_FORMAT = "2"  # bump when the template's layout changes


class RealNodesError(RuntimeError):
    """Real nodes could not be built, started or stopped cleanly."""


def node_ip(index: int) -> str:
    return f"198.18.0.{10 + index}"


def pod_subnet(index: int) -> tuple[str, str]:
    """(subnet, gateway) of node ``index``'s bridge."""
    return f"198.19.{index}.0/24", f"198.19.{index}.1"


def plan_nodes(gpu_nodes: int, cpu_nodes: int, gpus: int) -> list[dict[str, Any]]:
    """Names, roles, addresses and bridges of the real nodes: CPU nodes first (index 0..)."""
    out = []
    for role, count in (("cpu", cpu_nodes), ("gpu", gpu_nodes)):
        for i in range(count):
            index = len(out)
            subnet, gateway = pod_subnet(index)
            out.append({
                "name": f"real-{role}-{i}", "role": role, "index": index, "gpus": gpus if role == "gpu" else 0,
                "ip": node_ip(index), "subnet": subnet, "gateway": gateway, "bridge": f"mrbr{index}",
            })
    return out


# --------------------------------------------------------------------------------------------
# Build: kubelet, Debian runtime, images (build.sh), then the containerd template (here)


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


def _containerd_config(root: Path, state: Path, sock: Path, sandbox_image: str, cni_conf: Path | None) -> str:
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


def _ctr(sock: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args],
                          text=True, capture_output=True, timeout=timeout)


def _wait_socket(sock: Path, proc: subprocess.Popen, what: str, log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RealNodesError(f"{what} exited (rc={proc.returncode}):\n{_tail(log_path)}")
        if sock.exists() and _ctr(sock, "version", timeout=10).returncode == 0:
            return
        time.sleep(0.2)
    raise RealNodesError(f"timed out waiting for {what} at {sock}:\n{_tail(log_path)}")


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


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
        cfg.write_text(_containerd_config(work / "root", work / "state", sock, images["pause"]["tag"], None))
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
                r = _ctr(sock, "images", "import", spec["tar"], timeout=900)
                if r.returncode != 0:
                    raise RealNodesError(f"ctr images import {spec['tar']}: {r.stderr.strip()}")
                out["images"][kind] = {"tag": spec["tag"], "import_seconds": round(time.monotonic() - t, 1)}
            for kind, spec in images.items():
                r = _ctr(sock, "images", "ls")
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
                r = _ctr(sock, "images", "tag", spec["tag"], out["images"][kind]["repo_digest"])
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


def _copy_root(template_root: Path, dest: Path) -> None:
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


# --------------------------------------------------------------------------------------------
# Machine state: cgroups, mounts, namespaces, sysctls


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (cpu, memory, ..., name=systemd)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[:1] == ["cgroup"]:
            out.append(Path(pre.split()[4]))
    return out


def own_memory_cgroup() -> str:
    """The caller's memory cgroup path ("/" if none): real-pod cgroups nest under it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return path
    return "/"


def _make_cgroup(path: str, created: list[str]) -> None:
    """mkdir ``path`` (and missing parents) in every hierarchy; cpuset dirs get their parent's
    cpus/mems. Appends each directory it created to ``created``."""
    for mount in cgroup_hierarchies():
        parts = [p for p in path.split("/") if p]
        cur = mount
        for part in parts:
            parent, cur = cur, cur / part
            if cur.is_dir():
                continue
            cur.mkdir()
            created.append(str(cur))
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (cur / f).exists():
                    (cur / f).write_text((parent / f).read_text().strip() or "\n")


def cgroup_pids(path: str) -> set[int]:
    """Every PID in cgroup ``path`` or below, in any hierarchy."""
    pids: set[int] = set()
    for mount in cgroup_hierarchies():
        top = mount / path.lstrip("/")
        if not top.is_dir():
            continue
        for dirpath, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split())
                except OSError:
                    pass
    return pids


def _remove_cgroup_tree(path: str) -> list[str]:
    """rmdir ``path`` and everything below it, deepest first, in every hierarchy; what is left."""
    left = []
    for mount in cgroup_hierarchies():
        top = mount / path.lstrip("/")
        if not top.is_dir():
            continue
        dirs = [Path(dp) for dp, _, _ in os.walk(top)]
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        if top.exists():
            left.append(str(top))
    return left


def _ns_inode(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def pids_in_namespace(ns: str, kind: str) -> set[int]:
    """PIDs whose ``kind`` namespace (net, mnt) is ``ns`` (e.g. ``net:[4026532001]``)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_inode(int(entry), kind) == ns:
            out.add(int(entry))
    return out


def read_sysctls(names: tuple[str, ...] = HOST_SYSCTLS) -> dict[str, str]:
    """Values of the machine's sysctls (as the calling process sees them), missing ones left out."""
    out = {}
    for n in names:
        try:
            out[n.replace("/", ".")] = Path("/proc/sys", n).read_text().strip()
        except OSError:
            pass
    return out


def host_snapshot() -> dict[str, Any]:
    """What a real-pod cluster must leave as it found it on the machine: sysctls, network
    interfaces, named network namespaces, iptables rules, mount points."""

    def run(*argv: str) -> str:
        if not shutil.which(argv[0]):
            return f"({argv[0]} not installed)"
        r = subprocess.run(list(argv), text=True, capture_output=True)
        return r.stdout

    def rules(text: str) -> list[str]:  # iptables-save without comments and counters
        return [ln.split(" [")[0] if ln.startswith(":") else ln for ln in text.splitlines() if not ln.startswith("#")]

    mounts = sorted({ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()})
    return {
        "sysctls": read_sysctls(),
        "links": sorted(ln.split(":")[1].strip().split("@")[0] for ln in run("ip", "-o", "link", "show").splitlines()),
        "netns": sorted(run("ip", "netns", "list").split()),
        "iptables": rules(run("iptables-save")),
        "ip6tables": rules(run("ip6tables-save")),
        "mounts": mounts,
    }


# --------------------------------------------------------------------------------------------
# Processes


def _spawn(fg: ModuleType, name: str, argv: list[str], logs: Path, die_with_parent: bool,
           cgroup: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start ``argv`` in its own session (like fakegpu's processes), optionally inside ``cgroup`` (all
    hierarchies, joined before exec so that everything it starts lands there too)."""
    procs_files = ([str(m / cgroup.lstrip("/") / "cgroup.procs") for m in cgroup_hierarchies()]
                   if cgroup else [])

    def pre() -> None:
        for f in procs_files:
            with open(f, "w") as fh:
                fh.write(str(os.getpid()))
        if die_with_parent:
            fg._pdeathsig()

    logf = open(logs / f"{name}.log", "ab", buffering=0)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True, close_fds=True, preexec_fn=pre)
    logf.close()
    st = None
    for _ in range(100):
        st = fg._proc_starttime(proc.pid)
        if st:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "pgid": proc.pid, "starttime": st, "argv": argv, "log": str(logs / f"{name}.log")}


def _wait_log(rec: dict[str, Any], fg: ModuleType, text: str, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    path = Path(rec["log"])
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if not fg._is_ours_and_alive(rec):
            raise RealNodesError(f"{what} exited:\n{_tail(path)}")
        time.sleep(0.1)
    raise RealNodesError(f"timed out after {timeout:.0f}s waiting for {what}:\n{_tail(path)}")


def _kill_pids(pids: set[int]) -> None:
    for pid in pids - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------------------------
# The real-pod cluster


class RealCluster:
    """One run's network namespace, relay, DNS stub and real nodes; all its state lives in
    ``state`` (a JSON-able dict that fakegpu keeps in ``state.json`` under ``"real"``)."""

    def __init__(self, fg: ModuleType, d: Path, gpu_nodes: int, cpu_nodes: int, gpus: int,
                 die_with_parent: bool, save: Callable[[], None], log: Callable[[str], None]):
        self.fg, self.d, self.save, self.log = fg, d, save, log
        self.die_with_parent = die_with_parent
        run_id = hashlib.sha256(str(d).encode()).hexdigest()[:8]
        memcg = own_memory_cgroup().rstrip("/")
        self.state: dict[str, Any] = {
            "run_id": run_id,
            "cgroup_root": f"{memcg}/milesray-{run_id}",
            "created_cgroups": [],
            "nodes": plan_nodes(gpu_nodes, cpu_nodes, gpus),
            "processes": {},
            "timings": {},
        }
        self.logs = d / "logs"
        self.lock = threading.Lock()

    # ---- processes of this cluster, by name (recorded at once: `down` works after a failed `up`)
    def _start(self, name: str, argv: list[str], cgroup: str | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
        rec = _spawn(self.fg, name, argv, self.logs, self.die_with_parent, cgroup, env)
        with self.lock:
            self.state["processes"][name] = rec
            self.save()
        return rec

    def netns_path(self) -> str:
        return f"/proc/{self.state['processes']['netns']['pid']}/ns/net"

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        return ["nsenter", f"--net={self.netns_path()}", "--", *argv]

    def _in_netns(self, *argv: str) -> None:
        r = subprocess.run(self.wrap(list(argv)), text=True, capture_output=True)
        if r.returncode != 0:
            raise RealNodesError(f"{' '.join(argv)} (in the cluster namespace): {r.stderr.strip()}")

    # ---- phase 1: before the control plane
    def create_netns(self) -> None:
        """The cluster's network namespace, held by a ``sleep``: loopback up with the node and DNS
        addresses, forwarding on (in there only)."""
        missing = runtime_missing()
        if missing:
            raise RealNodesError(f"missing on this machine: {', '.join(missing)} (run: cluster/build.sh real-nodes)")
        t = time.monotonic()
        rec = self._start("netns", ["unshare", "--net", "--", "sleep", "infinity"])
        mine = _ns_inode(os.getpid(), "net")
        for _ in range(200):
            ns = _ns_inode(rec["pid"], "net")
            if ns and ns != mine and Path(f"/proc/{rec['pid']}/comm").read_text().strip() == "sleep":
                break
            time.sleep(0.01)
        else:
            raise RealNodesError(f"the network namespace holder did not start:\n{_tail(Path(rec['log']))}")
        self.state["netns"] = ns
        self.save()
        self._in_netns("ip", "link", "set", "lo", "up")
        for ip in [DNS_IP, MACHINE_IP, KUBERNETES_SERVICE_IP] + [n["ip"] for n in self.state["nodes"]]:
            self._in_netns("ip", "addr", "add", f"{ip}/32", "dev", "lo")
        # Pods on different nodes reach each other through this namespace (its own ip_forward).
        self._in_netns("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        self.state["timings"]["netns"] = time.monotonic() - t

    def start_relay(self, ports: list[int], api_port: int | None = None) -> None:
        """The machine's loopback -> the namespace at ``ports``; with ``api_port``, also the in-cluster API
        address (``KUBERNETES_SERVICE_IP:443``) -> the apiserver, for pods using the in-cluster config."""
        argv = [sys.executable, str(NSRELAY_PY), "--netns", self.netns_path()]
        for p in ports:
            argv += ["--port", str(p)]
        if api_port:
            argv += ["--inside", f"{KUBERNETES_SERVICE_IP}:443={api_port}"]
        rec = self._start("nsrelay", argv)
        _wait_log(rec, self.fg, "ready", "nsrelay", 20)

    def client_identities(self) -> list[tuple[str, str, list[str]]]:
        """(file stem, CN, groups) of the extra client certificates: one per kubelet, the DNS stub,
        the apiserver's kubelet client."""
        out = [(f"node-{n['name']}", f"system:node:{n['name']}", ["system:nodes"]) for n in self.state["nodes"]]
        out.append(("dns-stub", "milesray-dns-stub", []))
        out.append(("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]))
        return out

    @staticmethod
    def apiserver_args(pki: Path) -> list[str]:
        return [
            # Reach kubelets by their InternalIP (the node name resolves nowhere: no machine resolver).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        ]

    # ---- phase 2: after the control plane is ready
    def start_nodes(self, api: Any, server: str, pki: Path, timeout: float) -> None:
        fg = self.fg
        t0 = time.monotonic()
        deadline = t0 + timeout
        tmeta = ensure_template(fg, self.log)
        self.state["images"] = tmeta["images"]
        self.save()
        self._start_dns(api, server, pki)
        _make_cgroup(self.state["cgroup_root"], self.state["created_cgroups"])
        self.save()
        for n in self.state["nodes"]:
            t = time.monotonic()
            self._start_node(n, server, pki)
            self.state["timings"][f"node-{n['name']}-started"] = time.monotonic() - t
        t = time.monotonic()
        self._wait_nodes(api, deadline)
        self.state["timings"]["nodes-ready-wait"] = time.monotonic() - t
        self.state["timings"]["real-nodes-total"] = time.monotonic() - t0
        self.save()

    def _start_dns(self, api: Any, server: str, pki: Path) -> None:
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "milesray:dns-stub"},
            "rules": [
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "milesray:dns-stub"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "milesray:dns-stub"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "milesray-dns-stub"}],
        }
        for path, body in (("clusterroles", role), ("clusterrolebindings", binding)):
            code, out = api.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{path}", body)
            if code not in (201, 409):
                raise RealNodesError(f"creating {path}/milesray:dns-stub: HTTP {code}: {out}")
        rec = self._start("dnsstub", self.wrap([
            sys.executable, str(DNSSTUB_PY), "--listen", DNS_IP, "--server", server,
            "--ca", str(pki / "ca.crt"), "--cert", str(pki / "dns-stub.crt"), "--key", str(pki / "dns-stub.key"),
        ]))
        _wait_log(rec, self.fg, "ready", "dnsstub", 30)

    def _node_dir(self, n: dict[str, Any]) -> Path:
        return self.d / "nodes" / n["name"]

    def _start_node(self, n: dict[str, Any], server: str, pki: Path) -> None:
        fg = self.fg
        nd = self._node_dir(n)
        if nd.exists():
            shutil.rmtree(nd)
        for sub in ("sysctl", "cni/net.d", "cni/ipam", "containerd/state", "kubelet/root", "kubelet/pod-logs",
                    "kubelet/volume-plugins"):
            (nd / sub).mkdir(parents=True, exist_ok=True)
        tdir = template_dir(fg)
        _copy_root(tdir / "root", nd / "containerd" / "root")
        cg = f"{self.state['cgroup_root']}/{n['name']}"
        _make_cgroup(f"{cg}/runtime", self.state["created_cgroups"])
        self.save()

        # the node's mount namespace: tmpfs over fixed paths, the kubelet's sysctls covered
        script = ["set -e"]
        for m in NODE_TMPFS:
            script.append(f"mount -t tmpfs -o mode=0755,size=256m milesray-node {m}")
        for s in KUBELET_SYSCTLS:
            src = Path("/proc/sys", s)
            if src.exists():
                f = nd / "sysctl" / s.replace("/", ".")
                f.write_text(src.read_text())
                script.append(f"mount --bind {f} {src}")
        script += ["echo ready", "exec sleep infinity"]
        holder = self._start(f"{n['name']}-ns", self.wrap(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(script)]), cgroup=f"{cg}/runtime")
        _wait_log(holder, fg, "ready", f"{n['name']} mount namespace", 20)
        with self.lock:
            holder["mnt"] = _ns_inode(holder["pid"], "mnt")
            self.save()
        enter = ["nsenter", f"--target={holder['pid']}", "--net", "--mount", "--"]

        # containerd
        sock = nd / "containerd" / "containerd.sock"
        cni_conf = nd / "cni" / "net.d"
        (cni_conf / "10-milesray.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "milesray",
            "plugins": [{
                "type": "bridge", "bridge": n["bridge"], "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": n["subnet"], "gateway": n["gateway"]}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(nd / "cni" / "ipam")},
            }],
        }, indent=2))
        cfg = nd / "containerd" / "config.toml"
        cfg.write_text(_containerd_config(nd / "containerd" / "root", nd / "containerd" / "state", sock,
                                          self.state["images"]["pause"]["tag"], cni_conf))
        rec = self._start(f"{n['name']}-containerd", [*enter, "containerd", "--config", str(cfg)],
                          cgroup=f"{cg}/runtime")
        deadline = time.monotonic() + 60
        while not (sock.exists() and _ctr(sock, "version", timeout=10).returncode == 0):
            if not fg._is_ours_and_alive(rec) or time.monotonic() > deadline:
                raise RealNodesError(f"containerd of {n['name']} did not come up:\n{_tail(Path(rec['log']))}")
            time.sleep(0.2)

        # kubelet
        fg._kubeconfig(nd / "kubelet" / "kubeconfig", server, pki, f"node-{n['name']}")
        kcfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": n["ip"], "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": n["ip"], "healthzPort": KUBELET_HEALTHZ_PORT,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": cg, "cgroupsPerQOS": True, "failCgroupV1": False,
            "failSwapOn": False, "protectKernelDefaults": False,
            "clusterDNS": [DNS_IP], "clusterDomain": "cluster.local", "resolvConf": "",
            "containerRuntimeEndpoint": f"unix://{sock}",
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "podLogsDir": str(nd / "kubelet" / "pod-logs"),
            "volumePluginDir": str(nd / "kubelet" / "volume-plugins"),
            "registerNode": True,
            "registerWithTaints": ([{"key": GPU_RESOURCE, "effect": "NoSchedule"}] if n["gpus"] else []),
            "serializeImagePulls": False, "maxPods": 20, "rotateCertificates": False,
            "nodeStatusReportFrequency": "10s",
        }
        (nd / "kubelet" / "config.json").write_text(json.dumps(kcfg, indent=2))
        labels = [f"{REAL_NODE_LABEL}=true", f"milesray.io/role={n['role']}"]
        if n["gpus"]:
            labels += ["nvidia.com/gpu.present=true", f"nvidia.com/gpu.count={n['gpus']}",
                       "nvidia.com/gpu.product=Fake-GPU", "nvidia.com/gpu.memory=81559"]  # an H100 80GB's MiB
        paths = artifact_paths(fg)
        self._start(f"{n['name']}-kubelet", [
            *enter, str(paths["kubelet"]),
            f"--config={nd / 'kubelet' / 'config.json'}",
            f"--kubeconfig={nd / 'kubelet' / 'kubeconfig'}",
            f"--root-dir={nd / 'kubelet' / 'root'}",
            f"--cert-dir={nd / 'kubelet' / 'pki'}",
            f"--hostname-override={n['name']}",
            f"--node-ip={n['ip']}",
            f"--node-labels={','.join(labels)}",
            "--v=1",
        ], cgroup=f"{cg}/runtime")

    def _wait_nodes(self, api: Any, deadline: float) -> None:
        """Every real node registered, fake GPUs patched in, Ready and schedulable."""
        fg = self.fg
        want = {n["name"]: n for n in self.state["nodes"]}
        patched: set[str] = set()
        while True:
            code, body = api.request("GET", f"/api/v1/nodes?labelSelector={REAL_NODE_LABEL}%3Dtrue")
            nodes = {x["metadata"]["name"]: x for x in (body or {}).get("items", [])} if code == 200 else {}
            for name, node in nodes.items():
                gpus = want[name]["gpus"] if name in want else 0
                alloc = node.get("status", {}).get("allocatable", {})
                if gpus and alloc.get(GPU_RESOURCE) != str(gpus):
                    q = {GPU_RESOURCE: str(gpus)}
                    code, out = api.request("PATCH", f"/api/v1/nodes/{name}/status",
                                            {"status": {"capacity": q, "allocatable": q}}, "application/merge-patch+json")
                    if code != 200:
                        raise RealNodesError(f"patching {GPU_RESOURCE} into node {name}: HTTP {code}: {out}")
                    patched.add(name)
            ready = {
                name for name, node in nodes.items()
                if fg._node_schedulable(node) and (not want.get(name, {}).get("gpus")
                                                  or node["status"].get("allocatable", {}).get(GPU_RESOURCE)
                                                  == str(want[name]["gpus"]))
            }
            if set(want) <= ready:
                return
            for n in self.state["nodes"]:
                for part in ("ns", "containerd", "kubelet"):
                    rec = self.state["processes"][f"{n['name']}-{part}"]
                    if not fg._is_ours_and_alive(rec):
                        raise RealNodesError(f"{n['name']} {part} exited:\n{_tail(Path(rec['log']))}")
            if time.monotonic() > deadline:
                raise RealNodesError(
                    f"timed out waiting for real nodes Ready: have {sorted(ready)}, want {sorted(want)}\n"
                    + _tail(Path(self.state["processes"][f"{self.state['nodes'][-1]['name']}-kubelet"]["log"])))
            time.sleep(0.5)


# --------------------------------------------------------------------------------------------
# Teardown and proof of it


def _stop_node(fg: ModuleType, d: Path, real: dict[str, Any], n: dict[str, Any],
               log: Callable[[str], None]) -> dict[str, str]:
    """One node: kubelet, then its pods (SIGKILL by PID from the pods' cgroups, then killed and
    deleted through containerd), containerd, strays of its cgroups or mount namespace, the holder."""
    procs = real.get("processes", {})
    result: dict[str, str] = {}
    name = n["name"]
    t0 = time.monotonic()
    sock = d / "nodes" / name / "containerd" / "containerd.sock"
    cg = f"{real['cgroup_root']}/{name}"
    kubelet = procs.get(f"{name}-kubelet")
    if kubelet:
        result[f"{name}-kubelet"] = fg._stop(f"{name}-kubelet", kubelet, 10, log)
    _kill_pids(cgroup_pids(f"{cg}/kubepods"))  # every container process at once
    cd = procs.get(f"{name}-containerd")
    if cd and fg._is_ours_and_alive(cd) and sock.exists():
        # Every container and sandbox of the node: killed and deleted through containerd.
        r = _ctr(sock, "tasks", "ls", "-q", timeout=20)
        tasks = r.stdout.split() if r.returncode == 0 else []
        for t in tasks:
            _ctr(sock, "tasks", "kill", "--signal", "SIGKILL", t, timeout=20)
        for t in tasks:
            for _ in range(50):
                if _ctr(sock, "tasks", "delete", t, timeout=20).returncode == 0:
                    break
                time.sleep(0.1)
        r = _ctr(sock, "containers", "ls", "-q", timeout=20)
        for c in (r.stdout.split() if r.returncode == 0 else []):
            _ctr(sock, "containers", "delete", c, timeout=20)
        result[f"{name}-containers"] = f"{len(tasks)} task(s) killed and deleted"
    if cd:
        result[f"{name}-containerd"] = fg._stop(f"{name}-containerd", cd, 15, log)
    # Anything still in the node's cgroups (a shim, a container process) or mount namespace.
    holder = procs.get(f"{name}-ns")
    mnt = holder.get("mnt") if holder else None
    for _ in range(3):
        stray = cgroup_pids(cg) | (pids_in_namespace(mnt, "mnt") if mnt else set())
        if holder and fg._is_ours_and_alive(holder):
            stray.discard(holder["pid"])
        if not stray:
            break
        log(f"{name}: killing {len(stray)} leftover process(es) by PID: {sorted(stray)}")
        _kill_pids(stray)
        time.sleep(0.3)
    if holder:
        result[f"{name}-ns"] = fg._stop(f"{name}-ns", holder, 5, log)
    real.setdefault("teardown_timings", {})[name] = round(time.monotonic() - t0, 1)
    return result


def relay_out(real: dict[str, Any], port: int, logs: Path) -> tuple[str, dict[str, Any]]:
    """Make the machine's 127.0.0.1:``port`` reachable from pods at ``MACHINE_IP:port`` (a relay listening in
    the cluster's namespace, connecting on the machine's loopback; nothing else of the machine is reachable).
    Returns (``http://MACHINE_IP:port``-style host without scheme, the relay's process record); stop it with
    :func:`stop_relay_out` before the cluster stops."""
    netns = f"/proc/{real['processes']['netns']['pid']}/ns/net"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"nsrelay-out-{port}.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen([sys.executable, str(NSRELAY_PY), "--netns", netns, "--outward",
                                 f"{MACHINE_IP}:{port}={port}"], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if "ready" in log_path.read_text(errors="replace"):
            return f"{MACHINE_IP}:{port}", {"pid": proc.pid, "log": str(log_path), "_proc": proc}
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RealNodesError(f"the relay to the machine's port {port} did not start:\n{_tail(log_path)}")


def stop_relay_out(rec: dict[str, Any]) -> None:
    proc: subprocess.Popen = rec["_proc"]
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_nodes(fg: ModuleType, d: Path, real: dict[str, Any], log: Callable[[str], None]) -> dict[str, str]:
    """Containers, kubelets, containerds, node namespaces (all nodes at once), then the cgroups."""
    from concurrent.futures import ThreadPoolExecutor

    result: dict[str, str] = {}
    nodes = real.get("nodes", [])
    if nodes:
        with ThreadPoolExecutor(len(nodes)) as pool:
            for r in pool.map(lambda n: _stop_node(fg, d, real, n, log), nodes):
                result.update(r)
    left = _remove_cgroup_tree(real["cgroup_root"]) if real.get("cgroup_root") else []
    for c in sorted(real.get("created_cgroups", []), key=lambda p: len(Path(p).parts), reverse=True):
        try:
            Path(c).rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(c)  # e.g. a shared parent another run still uses
    result["cgroups"] = "removed" if not left else f"left: {left}"
    return result


def stop_netns(fg: ModuleType, d: Path, real: dict[str, Any], log: Callable[[str], None]) -> dict[str, str]:
    """The DNS stub, the relay and the namespace holder (after the control plane stopped); then
    any process still in the namespace, by PID; then the nodes' containerd roots."""
    procs = real.get("processes", {})
    result = {}
    for name in ("dnsstub", "nsrelay"):
        if name in procs:
            result[name] = fg._stop(name, procs[name], 5, log)
    ns = real.get("netns")
    if ns:
        stray = pids_in_namespace(ns, "net")
        holder = procs.get("netns")
        if holder:
            stray.discard(holder["pid"])
        if stray:
            log(f"killing {len(stray)} leftover process(es) in the cluster namespace by PID: {sorted(stray)}")
            _kill_pids(stray)
    if "netns" in procs:
        result["netns"] = fg._stop("netns", procs["netns"], 5, log)
    # The unpacked images (hard links into the template, plus the containers' layers): only once
    # nothing is mounted below the run directory any more.
    if not [m for m in host_snapshot()["mounts"] if m.startswith(str(d) + "/")]:
        for n in real.get("nodes", []):
            shutil.rmtree(d / "nodes" / n["name"] / "containerd", ignore_errors=True)
    return result


def leftovers(d: Path, real: dict[str, Any], fg: ModuleType) -> dict[str, list[Any]]:
    """Everything of a stopped real-pod cluster still on the machine (all lists empty = clean)."""
    procs = real.get("processes", {})
    out: dict[str, list[Any]] = {
        "processes": sorted(k for k, r in procs.items() if fg._is_ours_and_alive(r)),
        "netns_pids": sorted(pids_in_namespace(real["netns"], "net")) if real.get("netns") else [],
        "mntns_pids": sorted(p for r in procs.values() if r.get("mnt") for p in pids_in_namespace(r["mnt"], "mnt")),
        "cgroups": [str(m / real["cgroup_root"].lstrip("/")) for m in cgroup_hierarchies()
                    if real.get("cgroup_root") and (m / real["cgroup_root"].lstrip("/")).exists()]
        + [c for c in real.get("created_cgroups", []) if Path(c).exists()],
        "cgroup_pids": sorted(cgroup_pids(real["cgroup_root"])) if real.get("cgroup_root") else [],
        "mounts": [m for m in host_snapshot()["mounts"] if m.startswith(str(d) + "/")],
    }
    return out


def memory(real: dict[str, Any], control_plane: dict[str, Any], fg: ModuleType) -> dict[str, Any]:
    """RSS and PSS (MiB) of every process of the cluster: control plane, relay, DNS stub, node
    runtimes and pods (everything in the real nodes' cgroups)."""
    pids: dict[int, str] = {}
    for name, r in list(control_plane.items()) + list(real.get("processes", {}).items()):
        if fg._is_ours_and_alive(r):
            pids[r["pid"]] = name
    for n in real.get("nodes", []):
        cg = f"{real['cgroup_root']}/{n['name']}"
        for p in cgroup_pids(f"{cg}/runtime"):
            pids.setdefault(p, f"{n['name']}-runtime")
        for p in cgroup_pids(f"{cg}/kubepods"):
            pids.setdefault(p, f"{n['name']}-pods")
    groups: dict[str, dict[str, float]] = {}
    total = {"rss": 0.0, "pss": 0.0}
    for pid, group in pids.items():
        try:
            roll = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        vals = {ln.split(":")[0]: int(ln.split()[1]) / 1024 for ln in roll[1:] if ln.split()[0] in ("Rss:", "Pss:")}
        g = groups.setdefault(group, {"rss": 0.0, "pss": 0.0, "processes": 0})
        g["rss"] += vals.get("Rss", 0)
        g["pss"] += vals.get("Pss", 0)
        g["processes"] += 1
        total["rss"] += vals.get("Rss", 0)
        total["pss"] += vals.get("Pss", 0)
    return {"total_mib": {k: round(v) for k, v in total.items()},
            "by_group_mib": {k: {kk: round(vv) for kk, vv in v.items()} for k, v in sorted(groups.items())}}
