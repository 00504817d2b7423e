"""Real nodes (part of cluster/realnodes.py): their fixed addresses, ports and labels, the machine state they must
leave as it was, and the plan of which node has which name, address and bridge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"

