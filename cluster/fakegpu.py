#!/usr/bin/env python3
"""A real Kubernetes control plane with fake GPU nodes, on 127.0.0.1, without Docker.

    python cluster/fakegpu.py up [--nodes N] [--gpus 8] [--dir DIR]
    python cluster/fakegpu.py up --nodes 0 --cpu-nodes 0 --real-nodes 2 --real-gpus 2   # real pods
    python cluster/fakegpu.py status [--dir DIR]
    python cluster/fakegpu.py down [--dir DIR]

What runs (all built from published Go modules by cluster/build.sh, versions in cluster/versions.env):
etcd, kube-apiserver (TLS on 127.0.0.1, client certificates, authorization Node,RBAC),
kube-controller-manager, kube-scheduler, the kwok controller (simulates the kubelets of the fake
nodes: node heartbeats, pods Running/Ready, pod deletion) and the KubeRay operator (a local process).

N fake GPU nodes ``gpu-node-<i>`` advertise ``nvidia.com/gpu`` and carry the taint
``nvidia.com/gpu:NoSchedule``; one ``cpu-node-0`` (no GPUs, no taint) takes the Ray head.

With ``--real-nodes N`` (cluster/realnodes.py) the whole cluster moves into a network namespace of
its own and gains N real GPU nodes plus ``--real-cpu-nodes`` (default 1) real CPU nodes: kubelets
with their own containerd that run real containers from a locally built image.

``DIR/kubeconfig`` is a cluster-admin kubeconfig; ``DIR/state.json`` records PIDs, ports and paths;
logs go to ``DIR/logs/``. ``down`` stops the recorded processes by PID (SIGTERM, then SIGKILL),
never by name.

Importable: ``up(...) -> Cluster``, ``down(dir)``, ``status(dir)`` (stdlib only, plus the
``cryptography`` package for certificates).
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

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


# --------------------------------------------------------------------------------------------
# Versions, cache, build


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


# --------------------------------------------------------------------------------------------
# PKI (cryptography package; openssl is not needed)


def _pki(pki: Path, extra_clients: list[tuple[str, str, list[str]]] | tuple = ()) -> None:
    """CA, front-proxy CA, serving and client certificates; ``extra_clients``: more client
    certificates as (file stem, CN, groups)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=365)

    def write_key(name: str, key: Any) -> None:
        path = pki / f"{name}.key"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def write_cert(name: str, cert: Any) -> None:
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def make_ca(name: str, cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_key(name, key)
        write_cert(name, cert)
        return key, subject

    ca_key, ca_name = make_ca("ca", "miles-ray-fakegpu-ca")
    # Aggregation layer (request-header authentication): its own CA, as kubeadm does.
    fp_key, fp_name = make_ca("front-proxy-ca", "miles-ray-fakegpu-front-proxy-ca")

    def leaf(
        name: str,
        cn: str,
        orgs: list[str],
        server: bool,
        sans: list[Any] | None = None,
        issuer: tuple[Any, Any] | None = None,
    ) -> None:
        issuer_key, issuer_name = issuer or (ca_key, ca_name)
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        write_key(name, key)
        write_cert(name, b.sign(issuer_key, hashes.SHA256()))

    leaf(
        "apiserver",
        "kube-apiserver",
        [],
        server=True,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address(SERVICE_IP)),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
        ],
    )
    # Client identities. Components that Kubernetes bootstraps RBAC for use their own users; kwok
    # and the KubeRay operator stand in for a node fleet and an installed operator: cluster admins.
    leaf("admin", "miles-ray-admin", ["system:masters"], server=False)
    leaf("kube-controller-manager", "system:kube-controller-manager", [], server=False)
    leaf("kube-scheduler", "system:kube-scheduler", [], server=False)
    leaf("kwok", "kwok-controller", ["system:masters"], server=False)
    leaf("kuberay-operator", "kuberay-operator", ["system:masters"], server=False)
    leaf("front-proxy-client", "front-proxy-client", [], server=False, issuer=(fp_key, fp_name))
    for stem, cn, orgs in extra_clients:
        leaf(stem, cn, orgs, server=False)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key("sa", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fakegpu",
                "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki / f"{user}.crt"),
                    "client-key-data": b64(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "fakegpu", "context": {"cluster": "fakegpu", "user": user}}],
        "current-context": "fakegpu",
    }
    # JSON is valid YAML; every kubeconfig loader accepts it.
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


# --------------------------------------------------------------------------------------------
# Processes


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); starttime is field 22.
    return fields[19]


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _is_ours_and_alive(rec: dict[str, Any]) -> bool:
    pid = rec["pid"]
    try:  # reap if it is our child (pytest fixture case)
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    if _proc_starttime(pid) != rec.get("starttime"):
        return False  # gone, or the PID was reused by another process
    return _proc_state(pid) not in (None, "Z", "X")


def _pdeathsig() -> None:
    """In the child, before exec: get SIGTERM when the parent (e.g. a pytest process) dies."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _start(
    name: str, argv: list[str], logs: Path, env: dict[str, str] | None = None, die_with_parent: bool = False
) -> dict[str, Any]:
    logf = open(logs / f"{name}.log", "ab", buffering=0)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,  # own process group: a Ctrl-C in the caller does not reach it
        close_fds=True,
        preexec_fn=_pdeathsig if die_with_parent and sys.platform.startswith("linux") else None,
    )
    logf.close()
    st = None
    for _ in range(50):
        st = _proc_starttime(proc.pid)
        if st:
            break
        time.sleep(0.01)
    return {
        "pid": proc.pid,
        "pgid": proc.pid,
        "starttime": st,
        "argv": argv,
        "log": str(logs / f"{name}.log"),
    }


def _stop(name: str, rec: dict[str, Any], timeout: float, log: Callable[[str], None]) -> str:
    if not _is_ours_and_alive(rec):
        return "not running"
    pid = rec["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_ours_and_alive(rec):
            return "stopped"
        time.sleep(0.05)
    log(f"{name} (pid {pid}) did not exit after SIGTERM within {timeout:.0f}s: SIGKILL")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    for _ in range(100):
        if not _is_ours_and_alive(rec):
            break
        time.sleep(0.05)
    return "killed"


def _tail(path: str | Path, n: int = 40) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------------------------
# Minimal API client (stdlib): only what bootstrapping needs


class Api:
    def __init__(self, server: str, pki: Path, user: str = "admin"):
        self.server = server.rstrip("/")
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / f"{user}.crt"), str(pki / f"{user}.key"))
        self.ctx = ctx

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                code = resp.status
        except urllib.error.HTTPError as e:
            raw = e.read()
            code = e.code
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:
            return code, raw.decode(errors="replace")


def _http_ok(url: str, insecure: bool = True, timeout: float = 2) -> bool:
    ctx = ssl._create_unverified_context() if url.startswith("https") and insecure else None
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


_DEADLINE: list[float] = [float("inf")]  # overall deadline of the running `up` (its --timeout)


def _wait(what: str, pred: Callable[[], bool], timeout: float, procs: dict[str, Any], watch: str | None) -> None:
    deadline = min(time.monotonic() + timeout, _DEADLINE[0])
    timeout = max(0.0, deadline - time.monotonic())
    while time.monotonic() < deadline:
        if pred():
            return
        if watch and not _is_ours_and_alive(procs[watch]):
            raise FakeGPUError(f"{watch} exited while waiting for {what}:\n{_tail(procs[watch]['log'])}")
        time.sleep(0.2)
    extra = f"\n--- {watch} log tail ---\n{_tail(procs[watch]['log'])}" if watch else ""
    raise FakeGPUError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")


# --------------------------------------------------------------------------------------------
# Nodes


def node_manifest(name: str, gpus: int, cpu: str, memory: str, pods: int, ip: str = "") -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    taints: list[dict[str, str]] = []
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "1Ti"}
    if gpus > 0:
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.count"] = str(gpus)
        labels["nvidia.com/gpu.product"] = "Fake-GPU"
        labels["nvidia.com/gpu.memory"] = FAKE_GPU_MEMORY_MIB  # as GPU feature discovery labels an H100 80GB
        taints.append({"key": GPU_RESOURCE, "effect": "NoSchedule"})
        capacity[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            # kwok's node-initialize stage keeps addresses that are already there.
            "addresses": ([{"type": "InternalIP", "address": ip}] if ip else [])
            + [{"type": "Hostname", "address": name}],
        },
    }


def _node_ip(kind: int, i: int) -> str:
    """Distinct, never-routed InternalIPs: 10.<kind>.x.y (kind 1: GPU nodes, 2: CPU nodes)."""
    return f"10.{kind}.{(i // 250) % 250}.{i % 250 + 1}"


def _create_node(api: Api, manifest: dict[str, Any]) -> None:
    code, body = api.request("POST", "/api/v1/nodes", manifest)
    if code not in (201, 409):
        raise FakeGPUError(f"creating node {manifest['metadata']['name']}: HTTP {code}: {body}")
    name = manifest["metadata"]["name"]
    code, node = api.request("GET", f"/api/v1/nodes/{name}")
    labels = manifest["metadata"]["labels"]
    if code == 200 and any((node.get("metadata", {}).get("labels") or {}).get(k) != v for k, v in labels.items()):
        # a node made by an earlier version of this script: the labels it lacks (GPU feature discovery's)
        code, body = api.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}},
                                 "application/merge-patch+json")
        if code != 200:
            raise FakeGPUError(f"patching node labels {name}: HTTP {code}: {body}")
        code, node = api.request("GET", f"/api/v1/nodes/{name}")
    want = manifest["status"]["capacity"]
    have = (node or {}).get("status", {}).get("capacity", {}) if code == 200 else {}
    if any(have.get(k) != v for k, v in want.items()):
        patch = {"status": {"capacity": want, "allocatable": manifest["status"]["allocatable"]}}
        code, body = api.request(
            "PATCH", f"/api/v1/nodes/{name}/status", patch, "application/merge-patch+json"
        )
        if code != 200:
            raise FakeGPUError(f"patching node status {name}: HTTP {code}: {body}")


def _node_ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _node_schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready/unreachable taints."""
    lifecycle = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    taints = node.get("spec", {}).get("taints") or []
    return _node_ready(node) and not any(t.get("key") in lifecycle for t in taints)


# --------------------------------------------------------------------------------------------
# up / down / status


@dataclass
class Cluster:
    dir: Path
    kubeconfig: Path
    nodes: list[str]
    gpu_nodes: list[str]
    cpu_nodes: list[str]
    gpus_per_node: int
    server: str
    state: dict[str, Any] = field(repr=False, default_factory=dict)
    real_gpu_nodes: list[str] = field(default_factory=list)
    real_cpu_nodes: list[str] = field(default_factory=list)
    pod_image: str | None = None  # real nodes: the local pod image, repo:tag@sha256:digest

    def down(self, timeout: float = 15) -> dict[str, str]:
        return down(self.dir, timeout=timeout)

    @property
    def pids(self) -> dict[str, int]:
        return {k: v["pid"] for k, v in self.state.get("processes", {}).items()}


def _realnodes() -> Any:
    """cluster/realnodes.py, loaded once (it extends this module: real kubelets and containerd)."""
    import importlib.util

    name = "miles_ray_realnodes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "realnodes.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _read_state(d: Path) -> dict[str, Any] | None:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _write_state(d: Path, state: dict[str, Any]) -> None:
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


def up(
    dir: str | Path = DEFAULT_DIR,
    nodes: int = 4,
    gpus: int = 8,
    cpu_nodes: int = 1,
    timeout: float = 240,
    build: bool = True,
    log: Callable[[str], None] = log_stderr,
    die_with_parent: bool = False,
    real_nodes: int = 0,
    real_cpu_nodes: int = 0,
    real_gpus: int = 2,
) -> Cluster:
    """Start the control plane in ``dir`` and wait until it is ready.

    ``die_with_parent``: the started processes get SIGTERM if the calling process dies (for test
    fixtures: a killed pytest leaves nothing behind). The CLI ``up`` leaves them running.

    ``real_nodes``/``real_cpu_nodes`` > 0: everything runs in a network namespace of its own, plus
    that many real GPU nodes (``real_gpus`` fake ``nvidia.com/gpu`` each) and real CPU nodes
    (cluster/realnodes.py); the apiserver stays reachable at the same URL from the machine."""
    d = Path(dir).resolve()
    rn = _realnodes() if real_nodes or real_cpu_nodes else None
    if rn and any(d == Path(m) or Path(m) in d.parents for m in rn.NODE_TMPFS):
        raise FakeGPUError(f"--dir {d} is under {', '.join(rn.NODE_TMPFS)}, which real nodes cover with tmpfs")
    old = _read_state(d)
    old_procs = list((old or {}).get("processes", {}).values()) + list(((old or {}).get("real") or {}).get("processes", {}).values())
    if any(_is_ours_and_alive(r) for r in old_procs):
        raise FakeGPUError(f"a control plane is already running from {d} (run: fakegpu.py down --dir {d})")

    timings: dict[str, float] = {}
    if build:
        t = time.monotonic()
        info = ensure_built(log)
        timings["build"] = time.monotonic() - t
        if not info.get("cached"):
            log(f"build finished in {timings['build']:.0f}s")
    elif not all_cached():
        raise ToolchainMissing(f"binaries are not cached in {cache_dir()} (run cluster/build.sh)")
    if rn and build:
        t = time.monotonic()
        rn.ensure_built(sys.modules[__name__], log)
        timings["build-real-nodes"] = time.monotonic() - t
    elif rn and not (rn.template_dir(sys.modules[__name__]) / "template.json").is_file():
        raise ToolchainMissing(f"real-node artifacts are not cached in {cache_dir()} (run cluster/build.sh real-nodes)")

    t_up = time.monotonic()
    _DEADLINE[0] = t_up + timeout
    paths = artifact_paths()
    versions = read_versions()
    # Fresh state every time: etcd data, certificates, logs.
    remove_paths(d, ("etcd", "pki", "logs", "kwok-home", "state.json", "kubeconfig"))
    d.mkdir(parents=True, exist_ok=True)
    logs = d / "logs"
    pki = d / "pki"
    logs.mkdir()
    (d / "kwok-home").mkdir()

    names = [
        "etcd_client", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok",
        "kuberay_metrics", "kuberay_probe",
    ]
    ports = dict(zip(names, free_ports(len(names))))
    server = f"https://127.0.0.1:{ports['apiserver']}"

    procs: dict[str, Any] = {}
    state: dict[str, Any] = {}
    real = None
    if rn:
        real = rn.RealCluster(sys.modules[__name__], d, real_nodes, real_cpu_nodes, real_gpus,
                              die_with_parent, lambda: _write_state(d, state), log)

    t = time.monotonic()
    _pki(pki, real.client_identities() if real else ())
    _kubeconfig(d / "kubeconfig", server, pki, "admin")
    for user in ("kube-controller-manager", "kube-scheduler", "kwok", "kuberay-operator"):
        _kubeconfig(pki / f"{user}.kubeconfig", server, pki, user)
    timings["pki"] = time.monotonic() - t

    gpu_nodes = [f"gpu-node-{i}" for i in range(nodes)]
    cpu_node_names = [f"cpu-node-{i}" for i in range(cpu_nodes)]
    state.update({
        "dir": str(d),
        "kubeconfig": str(d / "kubeconfig"),
        "server": server,
        "ports": ports,
        "versions": versions,
        "binaries": {k: str(v) for k, v in paths.items()},
        "nodes": gpu_nodes + cpu_node_names,
        "gpu_nodes": gpu_nodes,
        "cpu_nodes": cpu_node_names,
        "gpus_per_node": gpus,
        "processes": procs,
        "ready": False,
        "die_with_parent": die_with_parent,
    })
    if real:
        state["real"] = real.state

    def started(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        procs[name] = _start(name, real.wrap(argv) if real else argv, logs, env, die_with_parent)
        _write_state(d, state)  # so that `down` works even if `up` dies half-way

    try:
        if real:  # the cluster's own network namespace, and the relay from the machine's loopback
            t = time.monotonic()
            real.create_netns()
            real.start_relay(sorted(ports.values()), api_port=ports["apiserver"])
            timings["netns+relay"] = time.monotonic() - t

        # etcd
        t = time.monotonic()
        etcd_url = f"http://127.0.0.1:{ports['etcd_client']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        started("etcd", [
            str(paths["etcd"]),
            "--name=fakegpu",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=fakegpu={peer_url}",
            "--unsafe-no-fsync=true",  # throwaway test data: no fsync
            "--log-level=warn",
        ])
        _wait("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), 30, procs, "etcd")
        timings["etcd"] = time.monotonic() - t

        # kube-apiserver
        t = time.monotonic()
        started("kube-apiserver", [
            str(paths["kube-apiserver"]),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports['apiserver']}",
            f"--cert-dir={pki / 'apiserver-generated'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            # The "kubernetes" Service cannot point at a loopback address: do not reconcile it.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
            *(real.apiserver_args(pki) if real else []),
        ])
        api = Api(server, pki)

        def apiserver_ready() -> bool:
            try:
                code, _ = api.request("GET", "/readyz", timeout=3)
            except (urllib.error.URLError, OSError):
                return False
            return code == 200

        _wait("kube-apiserver /readyz", apiserver_ready, 90, procs, "kube-apiserver")
        timings["kube-apiserver"] = time.monotonic() - t

        # Controllers first (they need only the apiserver), then CRDs and nodes, then the operator.
        t = time.monotonic()
        started("kube-controller-manager", [
            str(paths["kube-controller-manager"]),
            f"--kubeconfig={pki / 'kube-controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={pki / 'kube-controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={pki / 'kube-controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kcm']}",
            f"--cert-dir={pki / 'kcm-generated'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ])
        started("kube-scheduler", [
            str(paths["kube-scheduler"]),
            f"--kubeconfig={pki / 'kube-scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={pki / 'kube-scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={pki / 'kube-scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['scheduler']}",
            f"--cert-dir={pki / 'scheduler-generated'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ])
        started("kwok", [
            str(paths["kwok"]),
            f"--kubeconfig={pki / 'kwok.kubeconfig'}",
            f"--config={paths['kwok-stages']}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=40",
        ], env={"HOME": str(d / "kwok-home")})  # keep ~/.kwok/kwok.yaml out of it

        timings["controllers-started"] = time.monotonic() - t

        # KubeRay CRDs (the operator needs them)
        t = time.monotonic()
        crd_names = []
        for f in sorted(paths["crds"].glob("*.yaml")):
            code, body = api.request(
                "POST",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                f.read_bytes(),
                "application/yaml",
                timeout=60,
            )
            if code not in (201, 409):
                raise FakeGPUError(f"creating CRD from {f.name}: HTTP {code}: {str(body)[:2000]}")
            crd_names.append(body["metadata"]["name"] if code == 201 else f.stem.split("_", 1)[1] + "." + f.stem.split("_", 1)[0])
        state["crds"] = crd_names
        timings["crds-created"] = time.monotonic() - t

        # Nodes
        t = time.monotonic()
        for i, name in enumerate(gpu_nodes):
            _create_node(api, node_manifest(name, gpus, cpu="96", memory="1Ti", pods=110, ip=_node_ip(1, i)))
        for i, name in enumerate(cpu_node_names):
            _create_node(api, node_manifest(name, 0, cpu="32", memory="128Gi", pods=110, ip=_node_ip(2, i)))

        timings["nodes-created"] = time.monotonic() - t
        t = time.monotonic()

        def crds_established() -> bool:
            for n in crd_names:
                code, crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                if code != 200:
                    return False
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if conds.get("Established") != "True":
                    return False
            return True

        _wait("KubeRay CRDs Established", crds_established, 60, procs, "kube-apiserver")
        started("kuberay-operator", [
            str(paths["kuberay-operator"]),
            f"--metrics-addr=127.0.0.1:{ports['kuberay_metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{ports['kuberay_probe']}",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
        ], env={"KUBECONFIG": str(pki / "kuberay-operator.kubeconfig")})
        timings["crds-established+operator-started"] = time.monotonic() - t

        # Readiness of everything
        t = time.monotonic()
        _wait(
            "kube-controller-manager /healthz",
            lambda: _http_ok(f"https://127.0.0.1:{ports['kcm']}/healthz"), 60, procs, "kube-controller-manager",
        )
        _wait(
            "kube-scheduler /readyz",
            lambda: _http_ok(f"https://127.0.0.1:{ports['scheduler']}/readyz"), 60, procs, "kube-scheduler",
        )
        _wait("kwok /healthz", lambda: _http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), 60, procs, "kwok")

        all_nodes = gpu_nodes + cpu_node_names

        def nodes_ready() -> bool:
            code, body = api.request("GET", "/api/v1/nodes")
            if code != 200:
                return False
            ready = {n["metadata"]["name"] for n in body.get("items", []) if _node_schedulable(n)}
            return set(all_nodes) <= ready

        _wait(f"{len(all_nodes)} nodes Ready and untainted", nodes_ready, 90, procs, "kwok")

        def default_sa() -> bool:
            code, _ = api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            code2, _ = api.request("GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
            return code == 200 and code2 == 200

        _wait("ServiceAccount default/default", default_sa, 60, procs, "kube-controller-manager")
        _wait(
            "KubeRay operator /readyz",
            lambda: _http_ok(f"http://127.0.0.1:{ports['kuberay_probe']}/readyz"), 60, procs, "kuberay-operator",
        )
        # /readyz is a plain ping: also wait until the RayCluster controller runs its workers.
        oplog = Path(procs["kuberay-operator"]["log"])
        _wait(
            "KubeRay RayCluster controller workers",
            lambda: any(
                "controllers.RayCluster" in line and "Starting workers" in line
                for line in oplog.read_text(errors="replace").splitlines()
            ),
            60, procs, "kuberay-operator",
        )
        timings["ready-wait"] = time.monotonic() - t
        if real:
            t = time.monotonic()
            real.start_nodes(api, server, pki, max(1.0, _DEADLINE[0] - time.monotonic()))
            timings["real-nodes"] = time.monotonic() - t
    except BaseException:
        _DEADLINE[0] = float("inf")
        log("start-up failed: stopping what was started")
        if real:
            rn.stop_nodes(sys.modules[__name__], d, real.state, log)
        for name in reversed(list(procs)):
            _stop(name, procs[name], 10, log)
        if real:
            rn.stop_netns(sys.modules[__name__], d, real.state, log)
        state["failed"] = True
        _write_state(d, state)
        raise

    _DEADLINE[0] = float("inf")
    timings["up_total"] = time.monotonic() - t_up
    state["ready"] = True
    state["timings"] = timings
    _write_state(d, state)
    real_nodes_by_role = {
        role: [n["name"] for n in (real.state["nodes"] if real else []) if n["role"] == role] for role in ("gpu", "cpu")
    }
    return Cluster(
        dir=d,
        kubeconfig=d / "kubeconfig",
        nodes=gpu_nodes + cpu_node_names + real_nodes_by_role["gpu"] + real_nodes_by_role["cpu"],
        gpu_nodes=gpu_nodes,
        cpu_nodes=cpu_node_names,
        gpus_per_node=gpus,
        server=server,
        state=state,
        real_gpu_nodes=real_nodes_by_role["gpu"],
        real_cpu_nodes=real_nodes_by_role["cpu"],
        pod_image=real.state["images"]["ray"]["ref"] if real else None,
    )


def down(dir: str | Path = DEFAULT_DIR, timeout: float = 15, log: Callable[[str], None] = log_stderr) -> dict[str, str]:
    d = Path(dir).resolve()
    state = _read_state(d)
    if not state:
        return {}
    procs = state.get("processes", {})
    real = state.get("real")
    me = sys.modules[__name__]
    result: dict[str, str] = {}
    if real:  # pods, kubelets and containerd first, while the apiserver still answers
        result.update(_realnodes().stop_nodes(me, d, real, log))
    t = time.monotonic()
    for name in reversed([c for c in COMPONENTS if c in procs] + [c for c in procs if c not in COMPONENTS]):
        result[name] = _stop(name, procs[name], timeout, log)
    if real:
        real.setdefault("teardown_timings", {})["control-plane"] = round(time.monotonic() - t, 1)
    if real:  # then the DNS stub, the relay and the namespace itself
        t = time.monotonic()
        result.update(_realnodes().stop_netns(me, d, real, log))
        real.setdefault("teardown_timings", {})["netns"] = round(time.monotonic() - t, 1)
        state["leftovers"] = _realnodes().leftovers(d, real, me)
    state["ready"] = False
    state["stopped"] = result
    _write_state(d, state)
    return result


def status(dir: str | Path = DEFAULT_DIR) -> dict[str, Any]:
    d = Path(dir).resolve()
    state = _read_state(d)
    if not state:
        return {"dir": str(d), "running": False, "error": "no state.json"}
    out: dict[str, Any] = {"dir": str(d), "kubeconfig": state.get("kubeconfig"), "server": state.get("server")}
    recs = dict(state.get("processes", {}), **(state.get("real") or {}).get("processes", {}))
    procs = {name: {"pid": r["pid"], "alive": _is_ours_and_alive(r)} for name, r in recs.items()}
    out["processes"] = procs
    out["running"] = bool(procs) and all(p["alive"] for p in procs.values())
    if out["running"]:
        try:
            api = Api(state["server"], d / "pki")
            code, _ = api.request("GET", "/readyz", timeout=3)
            out["apiserver_ready"] = code == 200
            code, body = api.request("GET", "/api/v1/nodes", timeout=5)
            out["nodes"] = [
                {
                    "name": n["metadata"]["name"],
                    "ready": _node_ready(n),
                    "gpus": n.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0"),
                }
                for n in (body or {}).get("items", [])
            ] if code == 200 else []
        except (OSError, urllib.error.URLError) as e:
            out["apiserver_ready"] = False
            out["error"] = str(e)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fakegpu.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pu = sub.add_parser("up", help="build if needed, start, wait until ready")
    pu.add_argument("--nodes", type=int, default=4, help="number of fake GPU nodes (default 4)")
    pu.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per GPU node (default 8)")
    pu.add_argument("--cpu-nodes", type=int, default=1, help="number of CPU-only nodes (default 1)")
    pu.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    pu.add_argument("--timeout", type=float, default=240, help="seconds from start to ready (default 240)")
    pu.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    pu.add_argument("--real-nodes", type=int, default=0,
                    help="real GPU nodes (kubelet + containerd, real pods), in a network namespace of their own")
    pu.add_argument("--real-gpus", type=int, default=2, help="fake nvidia.com/gpu per real GPU node (default 2)")
    pu.add_argument("--real-cpu-nodes", type=int, default=None,
                    help="real CPU nodes for the Ray head (default 1 with --real-nodes, else 0)")
    pd = sub.add_parser("down", help="stop everything recorded in DIR/state.json, by PID")
    pd.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    pd.add_argument("--timeout", type=float, default=15, help="seconds between SIGTERM and SIGKILL")
    ps = sub.add_parser("status", help="show processes and nodes")
    ps.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = p.parse_args(argv)

    try:
        if args.cmd == "up":
            t = time.monotonic()
            real_cpu = args.real_cpu_nodes if args.real_cpu_nodes is not None else (1 if args.real_nodes else 0)
            c = up(args.dir, nodes=args.nodes, gpus=args.gpus, cpu_nodes=args.cpu_nodes,
                   timeout=args.timeout, build=not args.no_build,
                   real_nodes=args.real_nodes, real_cpu_nodes=real_cpu, real_gpus=args.real_gpus)
            print(f"ready in {time.monotonic() - t:.1f}s: {len(c.gpu_nodes)} GPU nodes x {c.gpus_per_node} "
                  f"{GPU_RESOURCE} + {len(c.cpu_nodes)} CPU node(s)")
            if c.real_gpu_nodes or c.real_cpu_nodes:
                print(f"real nodes: {', '.join(c.real_cpu_nodes + c.real_gpu_nodes)} "
                      f"({args.real_gpus} {GPU_RESOURCE} per GPU node); pod image (imagePullPolicy Never): "
                      f"{c.pod_image}")
            print(f"export KUBECONFIG={c.kubeconfig}")
            kubectl = cache_dir() / "bin" / f"kubectl-{read_versions()['KUBERNETES_VERSION']}"
            if kubectl.exists():
                print(f"kubectl (matching version): {kubectl}")
            print(f"state: {c.dir / 'state.json'}  logs: {c.dir / 'logs'}")
            return 0
        if args.cmd == "down":
            res = down(args.dir, timeout=args.timeout)
            if not res:
                print(f"nothing recorded in {args.dir}")
            for name, what in res.items():
                print(f"{name:26s} {what}")
            left = {k: v for k, v in ((_read_state(Path(args.dir).resolve()) or {}).get("leftovers") or {}).items() if v}
            if left:
                log_stderr(f"ERROR: left behind: {json.dumps(left)}")
                return 1
            return 0
        if args.cmd == "status":
            st = status(args.dir)
            print(json.dumps(st, indent=2))
            return 0 if st.get("running") else 1
    except ToolchainMissing as e:
        log_stderr(f"ERROR: {e}")
        return 3
    except FakeGPUError as e:
        log_stderr(f"ERROR: {e}")
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
