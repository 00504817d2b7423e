"""One GPU's memory from a live Kubernetes cluster: the labels NVIDIA's GPU feature discovery sets on the GPU nodes
(``nvidia.com/gpu.memory`` in MiB, else ``nvidia.com/gpu.product`` through the product table), read from V1Node
objects (miles_ray.adapters.kube.gpu_nodes), interpreted in the core (miles_ray.core.memory), and held against by
``submit`` on a Kubernetes head (miles_ray.services.node_gpus)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client import V1Node, V1NodeSpec, V1NodeStatus, V1ObjectMeta, V1Pod, V1PodSpec

from miles_ray.adapters import kube
from miles_ray.adapters.kube import gpu_nodes
from miles_ray.core.config import MilesRayConfig
from miles_ray.core.errors import ConfigError, Forbidden, MemoryMisfit
from miles_ray.core.memory import GIB, MIB, gpu_memory_from_labels
from miles_ray.core.submission import SubmitRequest, validate_request
from miles_ray.services import node_gpus
from tests.conftest import IMAGE

H100_MIB = 81559  # nvidia-smi's MiB of an H100 80GB HBM3: what GPU feature discovery puts in nvidia.com/gpu.memory
ADDRESS = "k8s://ml/miles"


def node(name: str, gpus: int = 8, **labels: str) -> V1Node:
    alloc = {"cpu": "96", "memory": "1Ti", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return V1Node(metadata=V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **labels}),
                  spec=V1NodeSpec(), status=V1NodeStatus(allocatable=alloc, capacity=alloc))


def gfd(memory: int | None = None, product: str | None = None) -> dict[str, str]:
    out = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"}
    if memory is not None:
        out["nvidia.com/gpu.memory"] = str(memory)
    if product is not None:
        out["nvidia.com/gpu.product"] = product
    return out


def worker(node_name: str | None) -> V1Pod:
    return V1Pod(metadata=V1ObjectMeta(name=f"w-{node_name}"), spec=V1PodSpec(containers=[], node_name=node_name))


# -- reading V1Node objects (the adapter) ---------------------------------------------------------------------------

def test_gpu_labels_are_the_nvidia_gpu_ones() -> None:
    n = node("g0", **gfd(H100_MIB, "NVIDIA-H100-80GB-HBM3"), **{"nvidia.com/cuda.driver.major": "550"})
    assert gpu_nodes.gpu_labels(n) == {**gfd(H100_MIB, "NVIDIA-H100-80GB-HBM3")}
    assert gpu_nodes.gpu_labels(V1Node(metadata=V1ObjectMeta(name="bare"))) == {}


def test_the_nodes_the_workers_are_placed_on_else_every_gpu_node() -> None:
    nodes = [node("cpu-0", gpus=0), node("g0"), node("g1"), node("g2")]
    assert [n.metadata.name for n in gpu_nodes.placed_gpu_nodes(nodes, [worker("g1"), worker("g2")])] == ["g1", "g2"]
    # none placed yet (Pending, or no cluster named): every node that advertises GPUs, never a CPU node
    assert [n.metadata.name for n in gpu_nodes.placed_gpu_nodes(nodes, [worker(None)])] == ["g0", "g1", "g2"]
    assert [n.metadata.name for n in gpu_nodes.placed_gpu_nodes(nodes, [])] == ["g0", "g1", "g2"]


class FakeCore:
    def __init__(self, nodes: list[V1Node], pods: list[V1Pod]) -> None:
        self.nodes, self.pods, self.selectors = nodes, pods, []

    def list_node(self):
        return type("L", (), {"items": self.nodes})()

    def list_namespaced_pod(self, namespace: str, label_selector: str = ""):
        self.selectors.append((namespace, label_selector))
        return type("L", (), {"items": self.pods})()


def test_gpu_node_labels_reads_the_cluster_workers_nodes(monkeypatch) -> None:
    core = FakeCore([node("g0", **gfd(H100_MIB)), node("g1", **gfd(40960)), node("cpu", gpus=0)], [worker("g0")])
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    assert kube.gpu_node_labels(object(), "ml", "miles") == {"g0": gfd(H100_MIB)}
    assert core.selectors == [("ml", "ray.io/cluster=miles,ray.io/node-type=worker")]
    assert set(kube.gpu_node_labels(object())) == {"g0", "g1"}


# -- what the labels mean (the core) -----------------------------------------------------------------------------

def test_memory_label_in_mib() -> None:
    got = gpu_memory_from_labels({"g0": gfd(H100_MIB, "Fake-GPU"), "g1": gfd(H100_MIB, "Fake-GPU")})
    assert got.gpu_bytes == H100_MIB * MIB and "nvidia.com/gpu.memory=81559" in got.source
    assert "2 GPU node(s)" in got.source and got.unlabelled == []


@pytest.mark.parametrize("product, gib", [("NVIDIA-H100-80GB-HBM3", 79.6), ("NVIDIA-H200", 140.4),
                                          ("NVIDIA-A100-SXM4-40GB", 40.0), ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 80.0),
                                          ("NVIDIA-B200", 179.1), ("AMD-Instinct-MI300X", 192.0)])
def test_product_label_through_the_table(product: str, gib: float) -> None:
    got = gpu_memory_from_labels({"g0": gfd(product=product)})
    assert round(got.gpu_bytes / GIB, 1) == gib and "nvidia.com/gpu.product" in got.source


def test_heterogeneous_nodes_take_the_smallest_and_unlabelled_ones_are_named() -> None:
    got = gpu_memory_from_labels({"a": gfd(H100_MIB), "b": gfd(product="NVIDIA-A100-SXM4-40GB"), "c": {}})
    assert got.gpu_bytes == 40960 * MIB and "the smallest" in got.source and got.unlabelled == ["c"]


def test_no_labels_say_nothing() -> None:
    assert gpu_memory_from_labels({"a": {}, "b": {"nvidia.com/gpu.present": "true"}}).gpu_bytes is None
    assert gpu_memory_from_labels({}).gpu_bytes is None


@pytest.mark.parametrize("labels, fragment", [(gfd(product="NVIDIA-Imaginary-9000"), "is not one whose memory"),
                                              (gfd(memory=0), "is not a number of MiB"),
                                              ({"nvidia.com/gpu.memory": "80GB"}, "is not a number of MiB")])
def test_an_unreadable_label_is_one_line(labels: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        gpu_memory_from_labels({"g0": labels})
    assert fragment in e.value.message and "\n" not in e.value.message and "g0" in e.value.message


# -- where submit takes it from (the service) ---------------------------------------------------------------------

@pytest.fixture
def labels(monkeypatch):
    """The nodes' labels the service reads (set ``labels.nodes``; an exception instance is raised instead)."""
    state = type("S", (), {"nodes": {}})()

    def read(api, namespace, cluster):
        if isinstance(state.nodes, Exception):
            raise state.nodes
        return state.nodes

    monkeypatch.setattr(kube, "missing_kubeconfig", lambda path=None: None)
    monkeypatch.setattr(kube, "load_client", lambda kubeconfig=None, context=None: object())
    monkeypatch.setattr(kube, "gpu_node_labels", read)
    return state


def test_labels_give_the_gpu_memory_when_nothing_is_configured(labels) -> None:
    labels.nodes = {"g0": gfd(H100_MIB), "g1": gfd(H100_MIB)}
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(), ADDRESS)
    assert labelled.gpu_bytes == H100_MIB * MIB and "79.6 GiB per GPU from the nodes' label nvidia.com/gpu.memory" \
        in notice


def test_configured_gpu_memory_wins_and_a_different_label_is_said(labels) -> None:
    labels.nodes = {"g0": gfd(H100_MIB)}
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(gpu_memory="40GiB"), ADDRESS)
    assert labelled is None and "uses gpu_memory 40GiB" in notice and "79.6 GiB" in notice
    assert node_gpus.cluster_gpu_memory(MilesRayConfig(gpu_memory="81559MiB"), ADDRESS) == (None, None)


def test_labels_that_say_nothing_fall_back_to_the_config_and_say_so(labels) -> None:
    labels.nodes = {"g0": {}}
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(gpu_memory="80GiB"), ADDRESS)
    assert labelled is None and "carry no nvidia.com/gpu.memory" in notice and "gpu_memory 80GiB" in notice
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(), ADDRESS)
    assert labelled is None and notice.startswith("GPU memory unknown") and "not checked" in notice


def test_nodes_that_cannot_be_read_fall_back_and_say_why(labels) -> None:
    labels.nodes = Forbidden("forbidden: list the GPU nodes' labels: nodes is forbidden")
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(gpu_memory="80GiB"), ADDRESS)
    assert labelled is None and "cannot be read (forbidden" in notice


def test_an_unknown_product_is_refused_unless_configured(labels) -> None:
    labels.nodes = {"g0": gfd(product="NVIDIA-Imaginary-9000")}
    with pytest.raises(ConfigError, match="NVIDIA-Imaginary-9000"):
        node_gpus.cluster_gpu_memory(MilesRayConfig(), ADDRESS)
    labelled, notice = node_gpus.cluster_gpu_memory(MilesRayConfig(gpu_memory="80GiB"), ADDRESS)
    assert labelled is None and "is not a known one: the memory check uses gpu_memory 80GiB" in notice


def test_not_a_kubernetes_head_reads_no_labels(labels) -> None:
    labels.nodes = RuntimeError("must not be read")
    assert node_gpus.cluster_gpu_memory(MilesRayConfig(), "http://10.0.0.1:8265") == (None, None)


def test_submit_refuses_a_misfit_by_the_labels_naming_them(labels) -> None:
    labels.nodes = {"g0": gfd(12288)}
    cfg = MilesRayConfig(recipe="Qwen3-4B", nodes=1, gpus_per_node=8, image=IMAGE)
    said: list[str] = []
    labelled = node_gpus.memory_on_cluster(cfg, SubmitRequest(), ADDRESS, said.append)
    assert said == ["notice: GPU memory 12.0 GiB per GPU from the nodes' label nvidia.com/gpu.memory=12288 "
                    "(1 GPU node(s))"]
    validate_request(cfg, SubmitRequest())  # without the labels nothing says the GPU memory: not checked
    with pytest.raises(MemoryMisfit) as e:
        validate_request(cfg, SubmitRequest(), labelled)
    line = e.value.message
    assert "does not fit (GPU memory from the nodes' label nvidia.com/gpu.memory=12288" in line and "\n" not in line
    assert "but has 12.0 GiB" in line
    # a rehearsal and --no-memory-check read no labels
    labels.nodes = RuntimeError("must not be read")
    assert node_gpus.memory_on_cluster(cfg, SubmitRequest(rehearse=True), ADDRESS, None) is None
    assert node_gpus.memory_on_cluster(cfg, SubmitRequest(no_memory_check=True), ADDRESS, None) is None


def test_submit_cli_refuses_before_recording(cli, clean_env, labels) -> None:
    labels.nodes = {"g0": gfd(12288)}
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "lab-a", "--address", ADDRESS, "--dry-run", "server")
    assert code == 2 and "nvidia.com/gpu.memory=12288" in err and "Traceback" not in out + err
    assert [line for line in err.splitlines() if line.startswith("error:")] and err.splitlines()[-1].startswith("error:")
    assert not list(Path(clean_env).rglob("lab-a*"))
    labels.nodes = {"g0": gfd(product="NVIDIA-Imaginary-9000")}
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "lab-b", "--address", ADDRESS)
    assert code == 2 and "NVIDIA-Imaginary-9000" in err and "Traceback" not in out + err
    assert not list(Path(clean_env).rglob("lab-b*"))


def test_a_host_misfit_is_told_with_the_gpu_parts_the_labels_refuse(cli, clean_env, labels) -> None:
    """Pods of 2Gi (the real-pod tier's) AND 12 GiB GPUs: the one line names the labels' memory and every part
    that does not fit, not the host part alone (it used to be refused for it before the labels were read)."""
    Path("miles-ray.yaml").write_text("memory_per_node: 2Gi\n")
    labels.nodes = {"g0": gfd(12288)}
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "lab-h", "--address", ADDRESS, "--dry-run", "server")
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and "does not fit (GPU memory from the nodes' label nvidia.com/gpu.memory=12288" in line
    assert "trainer needs" in line and "host needs" in line and "memory_per_node 2Gi" in line
    assert not list(Path(clean_env).rglob("lab-h*"))
    # labels that say nothing: the flag's memory is held against, and both are said before the one line
    labels.nodes = {"g0": {}}
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "lab-h", "--address", ADDRESS, "--dry-run", "server", "--gpu-memory",
                         "141GB")
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert "carry no nvidia.com/gpu.memory or nvidia.com/gpu.product label: the memory check uses gpu_memory 141GB" \
        in err and "does not fit (GPU memory from gpu_memory 141GB): host needs" in line and "trainer" not in line
    assert code == 2 and err.splitlines()[-1] == line
    # with no head this machine can read the labels of, the host misfit is said at once, the GPU memory unknown
    labels.nodes = RuntimeError("must not be read")
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "lab-h", "--address", "http://127.0.0.1:1", "--dry-run", "server")
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and "does not fit (GPU memory unknown, GPU parts not checked): host needs" in line, err
