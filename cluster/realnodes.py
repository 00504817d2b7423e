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

The parts, by topic, beside this file: ``realnodes_plan.py`` (addresses, the plan), ``realnodes_build.py`` (the
kubelet, runtime, images and containerd template), ``realnodes_host.py`` (cgroups, namespaces, sysctls,
processes), ``realnodes_teardown.py`` (stopping, and the proof nothing is left); this module holds
``RealCluster`` (the start-up) and keeps every name its users read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # cluster/ holds scripts, not a package: the parts are modules beside this one
    sys.path.insert(0, str(HERE))

# The parts, and every name this module has always had for its users (cluster/fakegpu.py, tests/infra, tests/realpods)
from realnodes_build import (artifact_paths, containerd_config, copy_root, ctr, ensure_built,  # noqa: E402
                             ensure_template, runtime_missing, template_dir)
from realnodes_host import (cgroup_hierarchies, cgroup_pids, host_snapshot, kill_pids, make_cgroup,  # noqa: E402
                            ns_inode, own_memory_cgroup, pids_in_namespace, read_sysctls, remove_cgroup_tree, spawn,
                            wait_log)
from realnodes_plan import (BUILD_SH, DNS_IP, DNSSTUB_PY, GPU_RESOURCE, HOST_SYSCTLS, IMAGE_PY,  # noqa: E402
                            KUBELET_HEALTHZ_PORT, KUBELET_PORT, KUBELET_SYSCTLS, KUBERNETES_SERVICE_IP, MACHINE_IP,
                            NODE_TMPFS, NSRELAY_PY, REAL_NODE_LABEL, TEMPLATE_FORMAT, RealNodesError, node_ip,
                            plan_nodes, pod_subnet, tail)
from realnodes_teardown import leftovers, memory, relay_out, stop_netns, stop_nodes, stop_relay_out  # noqa: E402


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
        rec = spawn(self.fg, name, argv, self.logs, self.die_with_parent, cgroup, env)
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
        mine = ns_inode(os.getpid(), "net")
        for _ in range(200):
            ns = ns_inode(rec["pid"], "net")
            if ns and ns != mine and Path(f"/proc/{rec['pid']}/comm").read_text().strip() == "sleep":
                break
            time.sleep(0.01)
        else:
            raise RealNodesError(f"the network namespace holder did not start:\n{tail(Path(rec['log']))}")
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
        wait_log(rec, self.fg, "ready", "nsrelay", 20)

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
        make_cgroup(self.state["cgroup_root"], self.state["created_cgroups"])
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
        wait_log(rec, self.fg, "ready", "dnsstub", 30)

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
        copy_root(tdir / "root", nd / "containerd" / "root")
        cg = f"{self.state['cgroup_root']}/{n['name']}"
        make_cgroup(f"{cg}/runtime", self.state["created_cgroups"])
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
        wait_log(holder, fg, "ready", f"{n['name']} mount namespace", 20)
        with self.lock:
            holder["mnt"] = ns_inode(holder["pid"], "mnt")
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
        cfg.write_text(containerd_config(nd / "containerd" / "root", nd / "containerd" / "state", sock,
                                          self.state["images"]["pause"]["tag"], cni_conf))
        rec = self._start(f"{n['name']}-containerd", [*enter, "containerd", "--config", str(cfg)],
                          cgroup=f"{cg}/runtime")
        deadline = time.monotonic() + 60
        while not (sock.exists() and ctr(sock, "version", timeout=10).returncode == 0):
            if not fg._is_ours_and_alive(rec) or time.monotonic() > deadline:
                raise RealNodesError(f"containerd of {n['name']} did not come up:\n{tail(Path(rec['log']))}")
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
                        raise RealNodesError(f"{n['name']} {part} exited:\n{tail(Path(rec['log']))}")
            if time.monotonic() > deadline:
                raise RealNodesError(
                    f"timed out waiting for real nodes Ready: have {sorted(ready)}, want {sorted(want)}\n"
                    + tail(Path(self.state["processes"][f"{self.state['nodes'][-1]['name']}-kubelet"]["log"])))
            time.sleep(0.5)
