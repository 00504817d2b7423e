"""``submit`` on the real kubelets' nodes holds the job against the GPU memory their labels say (issue 36): the
real GPU nodes register with the labels NVIDIA's GPU feature discovery sets (cluster/realnodes.py:
``nvidia.com/gpu.memory=81559``, an H100 80GB's MiB), and the pods this tier makes have 2Gi (``memory_per_node``).

A misfit is refused (exit 2) in ONE line that names where the GPU memory came from and every part that does not
fit -- the GPU part by the label AND the pods' host memory -- before anything is recorded or any head is reached.
Nodes whose labels say nothing fall back to ``--gpu-memory`` (or nothing: unknown) and say so.

No RayCluster is made (cheap: a few CLI runs on the session's cluster, ~20 s): the refusal comes before the head is
looked up, so the head named, ``k8s://miles-fit/none``, does not exist -- a submit that got past the check would
fail on it with another error, which the assertions would see. Nothing is fake here but the GPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from tests.infra.fixtures import poll
from tests.infra.realpods import RealPods

pytestmark = pytest.mark.real_pods

GFD = ("nvidia.com/gpu.memory", "nvidia.com/gpu.product")
ADDRESS = "k8s://miles-fit/none"


@pytest.fixture(scope="module")
def fit(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """``mr(*args)`` runs ``miles-ray submit`` against the real cluster with the tier's 2Gi pods; ``core`` reads
    the nodes."""
    from kubernetes import client

    work = tmp_path_factory.mktemp("fit")
    (work / "miles-ray.yaml").write_text(yaml.safe_dump({"memory_per_node": "2Gi", "image": real_pods.image,
                                                         "ray_version": "2.60.0"}))
    env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "MILES_RAY_CONFIG": str(work / "miles-ray.yaml"),
           "MILES_RAY_STATE_DIR": str(work / "state")}

    def submit(run: str, *extra: str) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", "submit", "--recipe", "Qwen3.5-27B", "-N", "2",
                               "-G", str(real_pods.gpus_per_node), "--run", run, "--address", ADDRESS,
                               "--no-check-data", "--max-restarts", "0", *extra],
                              env=env, capture_output=True, text=True, timeout=300, cwd=work)
        return proc.returncode, proc.stdout, proc.stderr

    core = client.CoreV1Api(real_pods.api_client())
    nodes = [n for n in core.list_node().items if n.metadata.name in real_pods.gpu_nodes]
    return SimpleNamespace(submit=submit, core=core, nodes=nodes, work=work)


def _error_line(code: int, out: str, err: str) -> str:
    """The one error line of a refusal (exit 2, no traceback, the last line)."""
    assert code == 2, f"exit {code}: {err[-3000:]}"
    assert "Traceback" not in out + err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert err.splitlines()[-1] == line
    return line


def _nothing_recorded(fit: SimpleNamespace, run: str) -> None:
    assert not list(fit.work.rglob(f"{run}*"))  # no run record, no saved job under the state dir


def test_a_misfit_by_the_nodes_labels_is_refused_naming_them_before_anything(fit: SimpleNamespace) -> None:
    """Qwen3.5-27B on 2 x 2 GPUs: its bf16 weights on two GPUs per engine need more than SGLang's share (0.5) of
    the label's 79.6 GiB, and the 2Gi pods cannot hold its host part: both told, with the label, in one line."""
    assert len(fit.nodes) == 2 and all(n.metadata.labels.get("nvidia.com/gpu.memory") == "81559" for n in fit.nodes)
    line = _error_line(*fit.submit("fit-label"))  # a real submit, not a dry run
    assert ("does not fit (GPU memory from the nodes' label nvidia.com/gpu.memory=81559 (2 GPU node(s))): "
            "rollout needs") in line, line
    assert "of 79.6 GiB" in line and "host needs" in line and "memory_per_node 2Gi" in line, line
    _nothing_recorded(fit, "fit-label")
    # --gpu-memory is the user's word over the labels: the line names it instead, and the label it overrides is said
    code, out, err = fit.submit("fit-flag", "--gpu-memory", "40GiB")
    line = _error_line(code, out, err)
    assert "does not fit (GPU memory from gpu_memory 40GiB): trainer needs" in line, line
    assert "but has 40.0 GiB (40.0 GiB GPU); rollout needs" in line and "host needs" in line, line
    assert "the memory check uses gpu_memory 40GiB (40.0 GiB), not the nodes' label nvidia.com/gpu.memory=81559" \
        in err, err
    _nothing_recorded(fit, "fit-flag")


def test_nodes_whose_labels_say_nothing_fall_back_to_the_flag_and_say_so(fit: SimpleNamespace) -> None:
    saved = {n.metadata.name: {k: n.metadata.labels.get(k) for k in GFD} for n in fit.nodes}
    try:
        for name in saved:
            fit.core.patch_node(name, {"metadata": {"labels": {k: None for k in GFD}}})
        poll("the GPU nodes' GFD labels removed", lambda: not any(
            k in (fit.core.read_node(name).metadata.labels or {}) for name in saved for k in GFD), 30)
        # --gpu-memory 141GB: the GPU parts fit it; the 2Gi pods do not, and the line says which GPU memory it used
        code, out, err = fit.submit("fit-none", "--gpu-memory", "141GB")
        line = _error_line(code, out, err)
        assert ("notice: the cluster's GPU nodes carry no nvidia.com/gpu.memory or nvidia.com/gpu.product label: "
                "the memory check uses gpu_memory 141GB") in err, err
        assert "does not fit (GPU memory from gpu_memory 141GB): host needs" in line and "rollout" not in line, line
        _nothing_recorded(fit, "fit-none")
        # nothing configured either: unknown, said, the GPU parts not checked (not guessed, not refused)
        code, out, err = fit.submit("fit-unknown")
        line = _error_line(code, out, err)
        assert "notice: GPU memory unknown: the cluster's GPU nodes carry no nvidia.com/gpu.memory" in err, err
        assert "does not fit (GPU memory unknown, GPU parts not checked): host needs" in line, line
        _nothing_recorded(fit, "fit-unknown")
    finally:
        for name, labels in saved.items():
            fit.core.patch_node(name, {"metadata": {"labels": labels}})
    assert all(fit.core.read_node(name).metadata.labels.get("nvidia.com/gpu.memory") == "81559" for name in saved)
