"""--mode launcher on a Kubernetes cluster: the upstream launcher becomes a Polyaxon job in the Miles image
that submits to the head service. Checked against the real Polyaxon API server; the live-Ray preflight
that precedes it in `submit` needs a real head (covered on the embedded cluster), so this test calls the
service step directly."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.polyaxon


def test_launcher_runs_as_a_polyaxon_job_against_the_head(polyaxon_server, monkeypatch, tmp_path):
    from miles_ray.adapters import state
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.core.config import load_config
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN
    from miles_ray.services.jobs import launcher_as_polyaxon_job

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    api = PolyaxonApi(host=polyaxon_server.host)
    polyaxon_server.create_project("miles-launch")
    cfg = load_config({"nodes": 2, "image": IMAGE, "namespace": "ml", "name": "q4", "polyaxon_host": polyaxon_server.host,
                       "polyaxon_project": "miles-launch"}, environ={})
    recipe = BUILTIN["Qwen3-4B"]
    plan = plan_split(recipe, 2, 8)
    record = {"schema": "miles-ray/run-record/v1", "run": "l-1", "cluster": "q4", "backend": "kuberay",
              "address": "k8s://ml/q4", "submission_id": "miles-ray-q4-l-1", "mode": "launcher", "created": "t",
              "image": IMAGE, "image_digest": IMAGE.split("@")[1], "ray_version": "2.60.0",
              "recipe": recipe.name, "recipe_hash": recipe.content_hash(), "recipe_spec": {}, "split": {},
              "output_dir": "/mnt/miles/runs/l-1", "entrypoint": "launcher"}
    result = launcher_as_polyaxon_job(cfg, recipe, plan, record, [])
    run = api.wait_for_status("default", "miles-launch", result["polyaxon_uuid"], {"compiled", "queued"}, timeout=30)
    content = run["raw_content"]
    content = json.loads(content) if isinstance(content, str) else content
    c = content["component"]["run"]["container"]
    assert content["component"]["run"]["kind"] == "job"
    assert c["image"] == IMAGE and c["workingDir"] == "/root/miles"
    assert c["command"] == ["python3", "/root/miles/scripts/run_qwen3_dense.py"]
    assert c["args"][:6] == ["--model-name", "Qwen3-4B", "--num-nodes", "2", "--num-gpus-per-node", "8"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and env["RAY_ADDRESS"] == "http://q4-head-svc.ml.svc:8265"
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])  # the launcher only submits
    assert state.load_record("l-1")["polyaxon_run_uuid"] == result["polyaxon_uuid"]
