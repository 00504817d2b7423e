"""The fake-GPU control plane's start-up (``fakegpu.up``), phase by phase: each phase starts or creates one
part, waits until it answers and records its time in ``timings``; ``undo`` stops what the phases started."""

from __future__ import annotations

import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from fakenodes import create_node, node_ip, node_manifest, node_schedulable
from kubeapi import DEADLINE, Api, http_ok, wait
from pki import make_pki, write_kubeconfig
from procs import free_ports, is_ours_and_alive, start, stop
from testbed import (KWOK_ANNOTATION, POD_CIDR, SERVICE_CIDR, FakeGPUError, ToolchainMissing, read_state, remove_paths,
                     write_state)
from toolchain import all_cached, artifact_paths, cache_dir, ensure_built, read_versions

PORTS = ("etcd_client", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok", "kuberay_metrics", "kuberay_probe")


@dataclass
class Boot:
    """One ``up`` under way: its dir, binaries, ports, PKI, started processes and the state file's content."""

    dir: Path
    paths: dict[str, Path]
    ports: dict[str, int]
    server: str
    gpus: int
    gpu_nodes: list[str]
    cpu_nodes: list[str]
    die_with_parent: bool
    timings: dict[str, float]
    state: dict[str, Any]
    procs: dict[str, Any] = field(default_factory=dict)
    real: Any = None  # realnodes.RealCluster with real nodes
    api: Api | None = None
    crd_names: list[str] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def started(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = start(name, self.real.wrap(argv) if self.real else argv, self.logs, env,
                                 self.die_with_parent)
        write_state(self.dir, self.state)  # so that `down` works even if `up` dies half-way

    def wait(self, what: str, pred: Callable[[], bool], timeout: float, watch: str | None) -> None:
        wait(what, pred, timeout, self.procs, watch)


def refuse_running(d: Path, rn: ModuleType | None) -> None:
    """Refuse a dir real nodes would cover, and one whose control plane still runs."""
    if rn and any(d == Path(m) or Path(m) in d.parents for m in rn.NODE_TMPFS):
        raise FakeGPUError(f"--dir {d} is under {', '.join(rn.NODE_TMPFS)}, which real nodes cover with tmpfs")
    old = read_state(d) or {}
    old_procs = list(old.get("processes", {}).values()) + list((old.get("real") or {}).get("processes", {}).values())
    if any(is_ours_and_alive(r) for r in old_procs):
        raise FakeGPUError(f"a control plane is already running from {d} (run: fakegpu.py down --dir {d})")


def build(fg: ModuleType, rn: ModuleType | None, wanted: bool, log: Callable[[str], None],
          timings: dict[str, float]) -> None:
    """The binaries (and with real nodes their artifacts): built when missing, or refused with ``wanted`` False."""
    if wanted:
        t = time.monotonic()
        info = ensure_built(log)
        timings["build"] = time.monotonic() - t
        if not info.get("cached"):
            log(f"build finished in {timings['build']:.0f}s")
    elif not all_cached():
        raise ToolchainMissing(f"binaries are not cached in {cache_dir()} (run cluster/build.sh)")
    if rn and wanted:
        t = time.monotonic()
        rn.ensure_built(fg, log)
        timings["build-real-nodes"] = time.monotonic() - t
    elif rn and not (rn.template_dir(fg) / "template.json").is_file():
        raise ToolchainMissing(f"real-node artifacts are not cached in {cache_dir()} (run cluster/build.sh real-nodes)")


def prepare(d: Path, nodes: int, gpus: int, cpu_nodes: int, die_with_parent: bool,
            timings: dict[str, float]) -> Boot:
    """A fresh dir (etcd data, certificates, logs: new every time), free ports, and the state to record."""
    paths = artifact_paths()
    remove_paths(d, ("etcd", "pki", "logs", "kwok-home", "state.json", "kubeconfig"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir()
    (d / "kwok-home").mkdir()
    ports = dict(zip(PORTS, free_ports(len(PORTS))))
    server = f"https://127.0.0.1:{ports['apiserver']}"
    gpu_nodes = [f"gpu-node-{i}" for i in range(nodes)]
    cpu_node_names = [f"cpu-node-{i}" for i in range(cpu_nodes)]
    boot = Boot(dir=d, paths=paths, ports=ports, server=server, gpus=gpus, gpu_nodes=gpu_nodes,
                cpu_nodes=cpu_node_names, die_with_parent=die_with_parent, timings=timings, state={})
    boot.state.update({
        "dir": str(d),
        "kubeconfig": str(d / "kubeconfig"),
        "server": server,
        "ports": ports,
        "versions": read_versions(),
        "binaries": {k: str(v) for k, v in paths.items()},
        "nodes": gpu_nodes + cpu_node_names,
        "gpu_nodes": gpu_nodes,
        "cpu_nodes": cpu_node_names,
        "gpus_per_node": gpus,
        "processes": boot.procs,
        "ready": False,
        "die_with_parent": die_with_parent,
    })
    return boot


def certificates(boot: Boot) -> None:
    """The PKI (with the real nodes' client identities) and a kubeconfig per user."""
    t = time.monotonic()
    pki = boot.pki
    make_pki(pki, boot.real.client_identities() if boot.real else ())
    write_kubeconfig(boot.dir / "kubeconfig", boot.server, pki, "admin")
    for user in ("kube-controller-manager", "kube-scheduler", "kwok", "kuberay-operator"):
        write_kubeconfig(pki / f"{user}.kubeconfig", boot.server, pki, user)
    boot.timings["pki"] = time.monotonic() - t


def start_netns(boot: Boot) -> None:
    """With real nodes: the cluster's own network namespace, and the relay from the machine's loopback."""
    if boot.real:
        t = time.monotonic()
        boot.real.create_netns()
        boot.real.start_relay(sorted(boot.ports.values()), api_port=boot.ports["apiserver"])
        boot.timings["netns+relay"] = time.monotonic() - t


def start_etcd(boot: Boot) -> None:
    t = time.monotonic()
    d, ports, paths = boot.dir, boot.ports, boot.paths
    etcd_url = f"http://127.0.0.1:{ports['etcd_client']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    boot.started("etcd", [
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
    boot.wait("etcd /health", lambda: http_ok(f"{etcd_url}/health"), 30, "etcd")
    boot.timings["etcd"] = time.monotonic() - t


def start_apiserver(boot: Boot) -> None:
    t = time.monotonic()
    pki, ports, paths, real = boot.pki, boot.ports, boot.paths, boot.real
    boot.started("kube-apiserver", [
        str(paths["kube-apiserver"]),
        f"--etcd-servers=http://127.0.0.1:{ports['etcd_client']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['apiserver']}",
        f"--cert-dir={pki / 'apiserver-generated'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
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
    api = boot.api = Api(boot.server, pki)

    def apiserver_ready() -> bool:
        try:
            code, _ = api.request("GET", "/readyz", timeout=3)
        except (urllib.error.URLError, OSError):
            return False
        return code == 200

    boot.wait("kube-apiserver /readyz", apiserver_ready, 90, "kube-apiserver")
    boot.timings["kube-apiserver"] = time.monotonic() - t


def start_controllers(boot: Boot) -> None:
    """The controller manager, the scheduler and kwok: they need only the API server (then come the CRDs and the
    nodes, then the operator)."""
    t = time.monotonic()
    pki, ports, paths, d = boot.pki, boot.ports, boot.paths, boot.dir
    boot.started("kube-controller-manager", [
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
    boot.started("kube-scheduler", [
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
    boot.started("kwok", [
        str(paths["kwok"]),
        f"--kubeconfig={pki / 'kwok.kubeconfig'}",
        f"--config={paths['kwok-stages']}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        f"--cidr={POD_CIDR}",
        "--node-ip=10.0.0.1",
        "--node-lease-duration-seconds=40",
    ], env={"HOME": str(d / "kwok-home")})  # keep ~/.kwok/kwok.yaml out of it
    boot.timings["controllers-started"] = time.monotonic() - t


def create_crds(boot: Boot) -> None:
    """KubeRay's CRDs (the operator needs them)."""
    t = time.monotonic()
    for f in sorted(boot.paths["crds"].glob("*.yaml")):
        code, body = boot.api.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            f.read_bytes(),
            "application/yaml",
            timeout=60,
        )
        if code not in (201, 409):
            raise FakeGPUError(f"creating CRD from {f.name}: HTTP {code}: {str(body)[:2000]}")
        boot.crd_names.append(body["metadata"]["name"] if code == 201
                              else f.stem.split("_", 1)[1] + "." + f.stem.split("_", 1)[0])
    boot.state["crds"] = boot.crd_names
    boot.timings["crds-created"] = time.monotonic() - t


def create_nodes(boot: Boot) -> None:
    """The fake GPU nodes (tainted, with the GPU labels) and CPU nodes."""
    t = time.monotonic()
    for i, name in enumerate(boot.gpu_nodes):
        create_node(boot.api, node_manifest(name, boot.gpus, cpu="96", memory="1Ti", pods=110, ip=node_ip(1, i)))
    for i, name in enumerate(boot.cpu_nodes):
        create_node(boot.api, node_manifest(name, 0, cpu="32", memory="128Gi", pods=110, ip=node_ip(2, i)))
    boot.timings["nodes-created"] = time.monotonic() - t


def start_operator(boot: Boot) -> None:
    """The KubeRay operator, once its CRDs are Established."""
    t = time.monotonic()
    api, ports, paths, pki = boot.api, boot.ports, boot.paths, boot.pki

    def crds_established() -> bool:
        for n in boot.crd_names:
            code, crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
            if code != 200:
                return False
            conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conds.get("Established") != "True":
                return False
        return True

    boot.wait("KubeRay CRDs Established", crds_established, 60, "kube-apiserver")
    boot.started("kuberay-operator", [
        str(paths["kuberay-operator"]),
        f"--metrics-addr=127.0.0.1:{ports['kuberay_metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{ports['kuberay_probe']}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
    ], env={"KUBECONFIG": str(pki / "kuberay-operator.kubeconfig")})
    boot.timings["crds-established+operator-started"] = time.monotonic() - t


def wait_ready(boot: Boot) -> None:
    """Every component healthy, every node Ready and untainted, the default ServiceAccount made, and the
    operator's RayCluster controller running."""
    t = time.monotonic()
    api, ports, procs = boot.api, boot.ports, boot.procs
    boot.wait("kube-controller-manager /healthz", lambda: http_ok(f"https://127.0.0.1:{ports['kcm']}/healthz"), 60,
              "kube-controller-manager")
    boot.wait("kube-scheduler /readyz", lambda: http_ok(f"https://127.0.0.1:{ports['scheduler']}/readyz"), 60,
              "kube-scheduler")
    boot.wait("kwok /healthz", lambda: http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), 60, "kwok")
    all_nodes = boot.gpu_nodes + boot.cpu_nodes

    def nodes_ready() -> bool:
        code, body = api.request("GET", "/api/v1/nodes")
        if code != 200:
            return False
        ready = {n["metadata"]["name"] for n in body.get("items", []) if node_schedulable(n)}
        return set(all_nodes) <= ready

    boot.wait(f"{len(all_nodes)} nodes Ready and untainted", nodes_ready, 90, "kwok")

    def default_sa() -> bool:
        code, _ = api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        code2, _ = api.request("GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
        return code == 200 and code2 == 200

    boot.wait("ServiceAccount default/default", default_sa, 60, "kube-controller-manager")
    boot.wait("KubeRay operator /readyz", lambda: http_ok(f"http://127.0.0.1:{ports['kuberay_probe']}/readyz"), 60,
              "kuberay-operator")
    # /readyz is a plain ping: also wait until the RayCluster controller runs its workers.
    oplog = Path(procs["kuberay-operator"]["log"])
    boot.wait(
        "KubeRay RayCluster controller workers",
        lambda: any(
            "controllers.RayCluster" in line and "Starting workers" in line
            for line in oplog.read_text(errors="replace").splitlines()
        ),
        60, "kuberay-operator",
    )
    boot.timings["ready-wait"] = time.monotonic() - t


def start_real_nodes(boot: Boot) -> None:
    """With real nodes: their containerd and kubelets, within what is left of ``up``'s timeout."""
    if boot.real:
        t = time.monotonic()
        boot.real.start_nodes(boot.api, boot.server, boot.pki, max(1.0, DEADLINE[0] - time.monotonic()))
        boot.timings["real-nodes"] = time.monotonic() - t


def undo(fg: ModuleType, rn: ModuleType | None, boot: Boot, log: Callable[[str], None]) -> None:
    """A phase failed: stop the real nodes, then every started process in reverse order, then the namespace;
    the state file says it failed."""
    log("start-up failed: stopping what was started")
    if boot.real:
        rn.stop_nodes(fg, boot.dir, boot.real.state, log)
    for name in reversed(list(boot.procs)):
        stop(name, boot.procs[name], 10, log)
    if boot.real:
        rn.stop_netns(fg, boot.dir, boot.real.state, log)
    boot.state["failed"] = True
    write_state(boot.dir, boot.state)
