"""The real-pod cluster itself: one control plane + ``real-cpu-0`` (the head's node) + ``real-gpu-0/1`` (2 fake
GPUs each), real kubelets and containerd, all in a network namespace of their own (tests/infra/realpods.py).
Ray in its pods is tested in test_kubernetes_path.py (which also checks that the RayCluster ``up`` creates is
the one ``render -F kuberay`` prints); tests/realpods/test_zz_teardown.py checks the teardown leaves nothing.

What is fake here, and why: the GPUs (``nvidia.com/gpu`` patched into the node status; Ray's GPU
count comes from ``num-gpus``) — there is no GPU on this machine.
"""

from __future__ import annotations

import pytest

from tests.infra.realpods import RealPods, fakegpu

pytestmark = pytest.mark.real_pods


@pytest.fixture
def cluster(real_pods: RealPods) -> RealPods:
    """The tier's one real-pod cluster (session fixture; tests/realpods/test_zz_teardown.py stops it)."""
    return real_pods


def test_real_nodes_are_ready_with_fake_gpus(cluster: RealPods) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api_client())
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == set(cluster.cpu_nodes + cluster.gpu_nodes) == {"real-cpu-0", "real-gpu-0", "real-gpu-1"}
    ips = set()
    for name, n in nodes.items():
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions), name
        info = n.status.node_info
        assert info.kubelet_version == fakegpu.read_versions()["KUBERNETES_VERSION"]
        assert info.container_runtime_version.startswith("containerd://1.6.")
        ips.update(a.address for a in n.status.addresses if a.type == "InternalIP")
        gpus = n.status.allocatable.get("nvidia.com/gpu")
        if name in cluster.gpu_nodes:
            assert gpus == "2" and n.metadata.labels["nvidia.com/gpu.present"] == "true"
            assert [(t.key, t.effect) for t in n.spec.taints or []] == [("nvidia.com/gpu", "NoSchedule")]
        else:
            assert gpus is None and not n.spec.taints
    assert len(ips) == 3
    assert cluster.image.startswith("milesray.local/ray:2.60.0-") and "@sha256:" in cluster.image



def test_the_pod_image_bytecode_is_valid_without_mtimes(cluster: RealPods) -> None:
    """The image's files carry mtime 0 (reproducible build), so a timestamp-based .pyc never matches its source
    and every Python process in a pod would compile what it imports again; the build writes hash-based
    .pyc instead. Checked on the cached image itself: the venv's ``ray/__init__`` and the stdlib's ``os``."""
    import importlib.util
    import json
    import tarfile

    from tests.infra.realpods import realnodes

    image = realnodes.artifact_paths(fakegpu)["ray-image"]
    with tarfile.open(image) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        layer = outer.extractfile(manifest[0]["Layers"][0])
        wanted = {"./opt/ray/lib/python3.11/site-packages/ray/__init__.py",
                  "./opt/ray/lib/python3.11/site-packages/ray/__pycache__/__init__.cpython-311.pyc",
                  "./usr/lib/python3.11/os.py", "./usr/lib/python3.11/__pycache__/os.cpython-311.pyc"}
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=layer, mode="r|") as inner:
            for member in inner:
                if member.name in wanted:
                    files[member.name] = inner.extractfile(member).read()
                    if len(files) == len(wanted):
                        break
    assert len(files) == len(wanted), sorted(wanted - set(files))
    for source in (n for n in wanted if n.endswith(".py")):
        head, name = source.rsplit("/", 1)
        pyc = files[f"{head}/__pycache__/{name[:-3]}.cpython-311.pyc"]
        flags = int.from_bytes(pyc[4:8], "little")
        assert flags & 1, f"{source}: timestamp-based .pyc (flags {flags}): stale once mtimes are 0"
        assert pyc[8:16] == importlib.util.source_hash(files[source]), f"{source}: .pyc of another source"
