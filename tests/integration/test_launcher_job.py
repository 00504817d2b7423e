"""--mode launcher on a Kubernetes cluster: the upstream launcher becomes a Polyaxon job in the Miles image
that submits to the head service. Checked against the real Polyaxon API server; the live-Ray preflight
that precedes it in `submit` needs a real head (covered on the embedded cluster), so this test prepares the
job (the pure step of submit) and runs the service step that creates it."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.polyaxon


def test_launcher_runs_as_a_polyaxon_job_against_the_head(polyaxon_server, monkeypatch, tmp_path):
    from miles_ray.adapters import state
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.core.config import load_config
    from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
    from miles_ray.services.runs.polyaxon_job import launcher_as_polyaxon_job

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    api = PolyaxonApi(host=polyaxon_server.host)
    polyaxon_server.create_project("miles-launch")
    cfg = load_config({"nodes": 2, "image": IMAGE, "namespace": "ml", "name": "q4", "polyaxon_host": polyaxon_server.host,
                       "polyaxon_project": "miles-launch"}, environ={})
    valid = validate_request(cfg, SubmitRequest(run="l-1", mode="launcher"))
    job = prepare_submit(cfg, valid, SubmitTarget("kuberay", "k8s://ml/q4"), created="t", launchers_dir="/unused")
    assert job.kind == "launcher-polyaxon" and job.record["output_dir"] == "/mnt/miles/runs/l-1"
    result = launcher_as_polyaxon_job(cfg, job.with_head_ray_version(cfg, "2.60.0").record, job.operation)
    run = api.wait_for_status("default", "miles-launch", result.polyaxon_uuid, {"compiled", "queued"}, timeout=30)
    content = run["raw_content"]
    content = json.loads(content) if isinstance(content, str) else content
    c = content["component"]["run"]["container"]
    assert content["component"]["run"]["kind"] == "job"
    assert c["image"] == IMAGE and c["workingDir"] == "/root/miles"
    assert c["command"] == ["python3", "/root/miles/scripts/run_qwen3_dense.py"]
    assert c["args"][:6] == ["--model-name", "Qwen3-4B", "--num-nodes", "2", "--num-gpus-per-node", "8"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and env["RAY_ADDRESS"] == "http://q4-head-svc.ml.svc:8265"
    # the head's Ray token by reference to the Secret KubeRay made for RayCluster q4, as the Polyaxon server kept it
    token = next(e for e in c["env"] if e["name"] == "RAY_AUTH_TOKEN")
    assert env["RAY_AUTH_MODE"] == "token" and "value" not in token
    assert token["valueFrom"] == {"secretKeyRef": {"name": "q4", "key": "auth_token"}}
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])  # the launcher only submits
    assert state.load_record("l-1")["polyaxon_run_uuid"] == result.polyaxon_uuid
