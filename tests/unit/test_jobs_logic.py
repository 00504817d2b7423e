"""Submit logic that needs no cluster: address precedence, topology checks, env parsing, run names,
resume rules (the pure pieces live in miles_ray.core; the address precedence in miles_ray.services.heads)."""

from __future__ import annotations

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.entrypoint import RUN_NAME, default_run_name, submission_id
from miles_ray.core.errors import ConfigError
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from miles_ray.core.runs import RunRecord, resume_differences
from miles_ray.core.heads import in_cluster_url
from miles_ray.core.submission import check_topology, parse_env
from miles_ray.services.heads import resolve_address


def test_address_precedence(monkeypatch) -> None:
    cfg = load_config({"ray_address": "http://from-config:8265"}, environ={})
    monkeypatch.setenv("RAY_ADDRESS", "http://from-env:8265")
    assert resolve_address(cfg, "http://from-flag:8265/") == ("address", "http://from-flag:8265")
    assert resolve_address(cfg, None) == ("address", "http://from-env:8265")
    monkeypatch.delenv("RAY_ADDRESS")
    assert resolve_address(cfg, None) == ("address", "http://from-config:8265")
    with pytest.raises(ConfigError, match="not a dashboard URL"):
        resolve_address(cfg, "head:6379")


def test_in_cluster_url() -> None:
    assert in_cluster_url("k8s://ml/miles") == "http://miles-head-svc.ml.svc:8265"
    assert in_cluster_url("http://127.0.0.1:8265") == "http://127.0.0.1:8265"


def _topology(*gpu_nodes: float, head_cpus: float = 0, cpus: float = 9) -> dict:
    nodes = [{"gpus": 0.0, "cpus": head_cpus, "is_head": True}]
    nodes += [{"gpus": g, "cpus": cpus, "is_head": False} for g in gpu_nodes]
    return {"nodes": nodes}


def test_topology_against_plan() -> None:
    plan = plan_split(BUILTIN["Qwen3-4B"], 4, 8)
    assert check_topology(_topology(8, 8, 8, 8), plan) == []
    [p] = check_topology(_topology(8, 8, 8), plan)
    assert "3 GPU node(s) alive, the plan needs 4 (missing 1)" in p
    problems = check_topology(_topology(4, 4, 4, 4, 4, 4, 4, 4), plan)
    assert any("exactly 8 per node" in p for p in problems)
    assert any("no spare CPU" in p for p in check_topology(_topology(8, 8, 8, 8, cpus=8), plan))
    assert any("fewer CPUs than GPUs" in p for p in check_topology(_topology(8, 8, 8, 8, cpus=4, head_cpus=40), plan))


def test_parse_env() -> None:
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    for bad in ["A", "1A=2", "=x"]:
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_env([bad])
    for secret in ["HF_TOKEN=x", "WANDB_API_KEY=x", "AWS_SECRET_ACCESS_KEY=x", "DB_PASSWORD=x"]:
        with pytest.raises(ConfigError, match="looks like a credential") as info:
            parse_env([secret])
        assert "=x" not in str(info.value)


def test_run_names_and_ids() -> None:
    plan = plan_split(BUILTIN["Qwen3.5-4B"], 2, 8)
    name = default_run_name(BUILTIN["Qwen3.5-4B"], plan, "2026-12-02T12:00:00+00:00")
    assert RUN_NAME.match(name) and name.startswith("qwen3-5-4b-2n-")
    assert name != default_run_name(BUILTIN["Qwen3.5-4B"], plan, "2026-12-02T12:00:01+00:00")
    assert submission_id("miles", "q4-a") == submission_id("miles", "q4-a") == "miles-ray-miles-q4-a"


def test_resume_differences() -> None:
    recipe = BUILTIN["Qwen3-4B"]
    plan = plan_split(recipe, 2, 8)
    rec = RunRecord(schema="miles-ray/run-record/v1", run="a", cluster="c", backend="local", address="http://x",
                    submission_id="s", mode="direct", created="t", image=None, image_digest=None, ray_version=None,
                    recipe=recipe.name, recipe_hash=recipe.content_hash(), recipe_spec={}, split=plan.model_dump(),
                    output_dir="/o", entrypoint="e")
    assert resume_differences(rec, recipe.content_hash(), plan.model_dump()) == []
    other = plan_split(recipe, 4, 8)
    assert resume_differences(rec, recipe.content_hash(), other.model_dump()) == [
        "nodes 2 != 4", "actor_num_nodes 2 != 4", "trainer_gpus 16 != 32", "rollout_num_gpus 16 != 32"]
    assert "recipe hash" in resume_differences(rec, BUILTIN["Qwen3-32B"].content_hash(), plan.model_dump())[0]
