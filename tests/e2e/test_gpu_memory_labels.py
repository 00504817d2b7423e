"""On the real API server with the fake GPU nodes (cluster/fakegpu.py), which carry the labels NVIDIA's GPU feature
discovery sets (``nvidia.com/gpu.memory=81559``, an H100 80GB's MiB): ``submit`` reads the GPU memory from the
nodes the job would run on and refuses a misfit before anything is recorded; nodes whose labels say nothing fall
back to ``--gpu-memory`` and say so. Ray does not run in kwok pods, so the submits are server dry runs: the memory
check comes before the head is reached (a job that fits then fails to reach a head that is not there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.e2e

GFD = ("nvidia.com/gpu.memory", "nvidia.com/gpu.product")


def submit(cli, namespace: str, recipe: str, run: str, *extra: str) -> tuple[int, str, str]:
    return cli("submit", "--recipe", recipe, "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version", "2.60.0",
               "--run", run, "--address", f"k8s://{namespace}/miles-e2e", "--dry-run", "server",
               "--no-check-data", *extra)


def gpu_nodes(core_v1) -> list:
    return [n for n in core_v1.list_node().items if int((n.status.allocatable or {}).get("nvidia.com/gpu", 0)) > 0]


def test_submit_holds_the_job_against_the_gpu_nodes_labels(kube_env, cli, core_v1, namespace):
    nodes = gpu_nodes(core_v1)
    assert nodes and all(n.metadata.labels.get("nvidia.com/gpu.memory") == "81559" for n in nodes)

    # Qwen3.5-27B: its bf16 weights on one GPU per engine need more than SGLang's share of an 80 GiB GPU
    code, out, err = submit(cli, namespace, "Qwen3.5-27B", "lab-misfit")
    assert code == 2, err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert "does not fit (GPU memory from the nodes' label nvidia.com/gpu.memory=81559" in line
    assert "rollout needs" in line and "79.6 GiB" in line and "Traceback" not in out + err
    assert not list(Path.cwd().rglob("lab-misfit*"))  # nothing recorded (the state dir is under the test's cwd)

    # a job that fits goes on past the check, with the labels' memory said in one notice
    code, out, err = submit(cli, namespace, "Qwen3-4B", "lab-fits")
    assert "notice: GPU memory 79.6 GiB per GPU from the nodes' label nvidia.com/gpu.memory=81559" in err, err
    assert "does not fit" not in err

    # --gpu-memory is the user's word: it wins over the labels, and the label it overrides is said
    code, out, err = submit(cli, namespace, "Qwen3-4B", "lab-flag", "--gpu-memory", "40GiB")
    assert "the memory check uses gpu_memory 40GiB (40.0 GiB), not the nodes' label nvidia.com/gpu.memory=81559" \
        in err, err
    code, out, err = submit(cli, namespace, "Qwen3-4B", "lab-small", "--gpu-memory", "12GiB")
    assert code == 2 and "trainer needs" in err and "but has 12.0 GiB" in err


def test_nodes_without_labels_fall_back_to_the_flag_and_say_so(kube_env, cli, core_v1, namespace):
    nodes = gpu_nodes(core_v1)
    saved = {n.metadata.name: {k: n.metadata.labels.get(k) for k in GFD} for n in nodes}
    try:
        for n in nodes:
            core_v1.patch_node(n.metadata.name, {"metadata": {"labels": {k: None for k in GFD}}})
        code, out, err = submit(cli, namespace, "Qwen3.5-27B", "lab-none", "--gpu-memory", "141GB")
        assert "carry no nvidia.com/gpu.memory or nvidia.com/gpu.product label: the memory check uses gpu_memory " \
               "141GB" in err, err
        assert "does not fit" not in err
        code, out, err = submit(cli, namespace, "Qwen3.5-27B", "lab-unknown")
        assert "GPU memory unknown" in err and "does not fit" not in err
        # an unknown product with nothing configured: one line, exit 2
        core_v1.patch_node(nodes[0].metadata.name, {"metadata": {"labels": {"nvidia.com/gpu.product": "Fake-GPU"}}})
        code, out, err = submit(cli, namespace, "Qwen3-4B", "lab-product")
        assert code == 2 and "'Fake-GPU'" in err and "Traceback" not in out + err
        assert [x for x in err.splitlines() if x.startswith("error:")] == [err.splitlines()[-1]]
    finally:
        for name, labels in saved.items():
            core_v1.patch_node(name, {"metadata": {"labels": labels}})
