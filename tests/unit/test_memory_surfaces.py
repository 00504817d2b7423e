"""Will it fit, where else a GPU hour could be spent: ``up``/``render`` hold a named recipe's host memory against the
pods they create (memory_per_node), and ``doctor`` reports one finding per part of the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_ray.adapters import kube
from miles_ray.core.config import MilesRayConfig
from miles_ray.services.doctor.memory_checks import memory_findings
from tests.conftest import IMAGE

RENDER = ["render", "-F", "kuberay", "--image", IMAGE, "--ray-version", "2.60.0"]


# -- up / render -----------------------------------------------------------------------------------------------------

def test_render_refuses_a_named_recipe_whose_host_memory_exceeds_the_pods(cli, clean_env) -> None:
    # Qwen3-32B on one node: its CPU-offloaded optimizer alone is ~366 GiB, with the rest ~592 GiB > 512Gi
    code, out, err = cli(*RENDER, "--recipe", "Qwen3-32B", "-N", "1")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert "host needs" in err and "memory_per_node 512Gi" in err and "fits with: --nodes 2" in err
    # the pods' documents do not say which GPUs: the line says the GPU parts were not checked
    assert "does not fit (GPU memory unknown, GPU parts not checked): host needs" in err
    code, out, err = cli(*RENDER, "--recipe", "Qwen3-32B", "-N", "2")
    assert code == 0, err
    code, out, err = cli(*RENDER, "--recipe", "Qwen3-32B", "-N", "1", "--no-memory-check")
    assert code == 0 and "does NOT fit the pods" in err and "kind: RayCluster" in out


def test_render_reads_memory_per_node_from_the_config(cli, clean_env) -> None:
    Path("miles-ray.yaml").write_text("recipe: Qwen3-4B\nmemory_per_node: 64Gi\n")
    code, out, err = cli(*RENDER, "-N", "1")
    assert code == 2 and "host needs" in err and "memory_per_node 64Gi" in err and err.count("\n") == 1
    # no recipe named: the cluster may run any job (the smoke and real-pods tiers make 2-4Gi pods for fake trainers)
    Path("miles-ray.yaml").write_text("memory_per_node: 2Gi\n")
    code, out, err = cli(*RENDER, "-N", "1")
    assert code == 0, err


def test_render_of_a_recipe_without_model_args_is_not_estimated(cli, clean_env) -> None:
    Path("miles-ray.yaml").write_text("memory_per_node: 2Gi\n")
    code, out, err = cli(*RENDER, "--recipe", "Qwen3-4B-FSDP", "-N", "1")
    assert code == 0, err


def test_up_refuses_before_anything_is_contacted(cli, clean_env, monkeypatch) -> None:
    monkeypatch.setattr(kube, "load_client", lambda *a, **k: pytest.fail("up contacted the cluster"))
    code, out, err = cli("up", "--via", "kuberay", "--backend", "kubernetes", "--recipe", "Qwen3-32B", "-N", "1",
                         "--image", IMAGE, "--ray-version", "2.60.0", "--dry-run", "client")
    assert code == 2 and "host needs" in err and "Traceback" not in out + err
    assert err.strip().splitlines()[-1].startswith("error: ")
    code, out, err = cli("up", "--via", "kuberay", "--backend", "kubernetes", "--recipe", "Qwen3-32B", "-N", "1",
                         "--image", IMAGE, "--ray-version", "2.60.0", "--dry-run", "client", "--no-memory-check",
                         "-o", "json")
    assert code == 0 and "does NOT fit the pods" in err, err


# -- doctor ------------------------------------------------------------------------------------------------------------

def by_check(found) -> dict:
    return {f.check: f for f in found}


def test_doctor_reports_one_finding_per_part() -> None:
    found = by_check(memory_findings(MilesRayConfig(recipe="Qwen3-4B", nodes=1, gpu_memory="80GiB"), None, None))
    assert set(found) == {"memory_trainer", "memory_rollout", "memory_host", "memory_storage"}
    assert found["memory_trainer"].status == "ok" and "headroom" in found["memory_trainer"].summary
    assert found["memory_trainer"].checklist == "Validate GPU memory requirements for your recipe"
    assert found["memory_host"].status == "skipped" and "memory_per_node" in found["memory_host"].fix
    assert found["memory_storage"].status == "skipped"
    assert "GPU memory from gpu_memory 80GiB" in found["memory_trainer"].evidence


def test_doctor_says_a_misfit_of_the_configured_job_as_a_warning_with_the_fix() -> None:
    found = by_check(memory_findings(MilesRayConfig(recipe="Qwen3-4B", nodes=1, gpu_memory="24GiB"), None, None))
    trainer = found["memory_trainer"]
    assert trainer.status == "warning" and "but has 24.0 GiB" in trainer.summary
    assert trainer.fix.startswith("fits with: ")


def test_doctor_of_a_run_uses_its_record_and_a_misfit_is_a_problem(cli, clean_env) -> None:
    code, out, err = cli("submit", "--recipe", "Qwen3-4B", "-N", "1", "-G", "8", "--image", IMAGE, "--ray-version",
                         "2.60.0", "--run", "doc-m", "--dry-run", "client", "--no-memory-check", "--extra-args",
                         "--max-tokens-per-gpu 262144", "-o", "json")
    assert code == 0, err
    record = json.loads(out)["record"]
    found = by_check(memory_findings(MilesRayConfig(gpu_memory="80GiB"), record, None))
    assert found["memory_trainer"].status == "problem" and "run doc-m" in found["memory_trainer"].summary
    # the recorded job's --max-tokens-per-gpu counts (not the recipe's): without it, it fits
    record["entrypoint"] = record["entrypoint"].replace("--max-tokens-per-gpu 262144", "")
    assert by_check(memory_findings(MilesRayConfig(gpu_memory="80GiB"), record, None))["memory_trainer"].status \
        in ("ok", "warning")
    rehearsal = {**record, "mode": "rehearse"}
    [only] = memory_findings(MilesRayConfig(gpu_memory="80GiB"), rehearsal, None)
    assert only.status == "skipped" and "rehearsal" in only.summary


def test_doctor_takes_the_gpu_memory_from_the_nodes_labels(monkeypatch) -> None:
    monkeypatch.setattr(kube, "missing_kubeconfig", lambda path=None: None)
    monkeypatch.setattr(kube, "load_client", lambda kubeconfig=None, context=None: object())
    monkeypatch.setattr(kube, "gpu_node_labels", lambda api, ns, c: {"g0": {"nvidia.com/gpu.memory": "81559"}})
    found = by_check(memory_findings(MilesRayConfig(recipe="Qwen3-4B", nodes=1), None, "k8s://ml/miles"))
    assert found["memory_trainer"].status == "ok"
    assert any("nvidia.com/gpu.memory=81559" in e for e in found["memory_trainer"].evidence)
    monkeypatch.setattr(kube, "gpu_node_labels", lambda api, ns, c: {"g0": {"nvidia.com/gpu.product": "Mystery"}})
    [only] = memory_findings(MilesRayConfig(recipe="Qwen3-4B", nodes=1), None, "k8s://ml/miles")
    assert only.status == "skipped" and "Mystery" in only.summary


def test_doctor_of_a_recipe_without_model_args_is_one_skipped_finding() -> None:
    [only] = memory_findings(MilesRayConfig(recipe="Qwen3-4B-FSDP", nodes=1, gpu_memory="80GiB"), None, None)
    assert only.check == "memory" and only.status == "skipped" and "no model args" in only.summary
