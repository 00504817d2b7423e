"""`render --single-node` / `up --single-node`: the first step of the Polyaxon-Miles guide ("start with one
single-node job": one Polyaxon job running the upstream Miles launcher in one pod), compared field by field with
the guide's own component (tests/data/polyaxon_miles_guide_single_node.yaml), validated with Polyaxon's own
schema, and created on the real Polyaxon API server (haupt sandbox: no agent, so the run is created and compiled
but never turned into a pod here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import IMAGE, REPO

GUIDE_COMPONENT = REPO / "tests" / "data" / "polyaxon_miles_guide_single_node.yaml"


def guide_component() -> dict:
    """The Polyaxon component of the Polyaxon-Miles guide, verbatim (tests/data)."""
    doc = yaml.safe_load(GUIDE_COMPONENT.read_text())
    assert doc["kind"] == "component"
    return doc


def render(cli, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli("render", "--single-node", *args)
    return code, (yaml.safe_load(out) if code == 0 else None), err


def test_matches_the_guide_field_by_field(cli, clean_env):
    guide = guide_component()
    code, op, err = render(cli, "--image", guide["run"]["container"]["image"], "--allow-unpinned")
    assert code == 0, err
    assert "not pinned by digest" in err  # the guide's image is a tag: accepted only with the warning
    assert op["kind"] == "operation"
    comp = op["component"]
    assert comp["kind"] == guide["kind"] == "component"
    assert comp["plugins"] == guide["plugins"] == {"shm": True}
    run, srun = comp["run"], guide["run"]
    assert run["kind"] == srun["kind"] == "job"
    assert run["connections"] == srun["connections"] == ["miles-data"]
    c, sc = run["container"], srun["container"]
    for key in ("image", "workingDir", "command", "args"):
        assert c[key] == sc[key], key
    assert c["args"][c["args"].index("--output-dir") + 1] == "/mnt/miles/runs/{{ globals.uuid }}"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == sc["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # beyond the guide: requests equal limits, CPU and memory from the config (the guide asks for them)
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "64", "memory": "512Gi",
                                                                      "nvidia.com/gpu": "8"}
    # the single-node launcher starts its own Ray: no external-Ray setting, no rayVersion
    assert "MILES_SCRIPT_EXTERNAL_RAY" not in json.dumps(op) and "rayVersion" not in json.dumps(op)


def test_pinned_image_and_config_flow_into_the_job(cli, clean_env):
    Path("miles-ray.yaml").write_text("mount_path: /data\nruns_dir: out\nmodels_dir: m\ndatasets_dir: d\n"
                                      "miles_root: /opt/miles\nconnection: team-data\ncpus_per_node: 32\n"
                                      "memory_per_node: 256Gi\n")
    code, op, err = render(cli, "--image", IMAGE, "--recipe", "Qwen3.5-9B", "-G", "4")
    assert code == 0, err
    run = op["component"]["run"]
    c = run["container"]
    assert c["image"] == IMAGE and c["workingDir"] == "/opt/miles" and run["connections"] == ["team-data"]
    assert c["args"] == ["--model-name", "Qwen3.5-9B", "--num-gpus-per-node", "4", "--model-dir", "/data/m",
                         "--data-dir", "/data/d", "--output-dir", "/data/out/{{ globals.uuid }}"]
    assert c["resources"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"}


def test_memory_below_the_shm_budget_is_refused(cli, clean_env):
    from miles_ray.core.single_node import memory_floor_gib

    assert memory_floor_gib(8) == 206 and memory_floor_gib(4) == 109
    Path("miles-ray.yaml").write_text("memory_per_node: 128Gi\n")
    code, _, err = render(cli, "--image", IMAGE)
    assert code == 2
    assert "memory_per_node 128Gi is below the single-node floor of 206Gi for 8 GPUs" in err
    assert "/dev/shm" in err and err.count("error:") == 1
    Path("miles-ray.yaml").write_text("memory_per_node: 206Gi\n")
    assert render(cli, "--image", IMAGE)[0] == 0


def test_preset_owns_cpu_and_memory(cli, clean_env):
    Path("miles-ray.yaml").write_text("polyaxon_preset: gpu-h100\nmemory_per_node: 1Gi\n")
    code, op, err = render(cli, "--image", IMAGE)
    assert code == 0, err
    assert op["presets"] == ["gpu-h100"]
    assert op["component"]["run"]["container"]["resources"] == {"limits": {"nvidia.com/gpu": "8"},
                                                                 "requests": {"nvidia.com/gpu": "8"}}
    assert "preset 'gpu-h100'" in err and ">= 206Gi" in err


@pytest.mark.parametrize("args, message", [
    (["--image", IMAGE, "--nodes", "2"], "one pod, not 2 nodes"),
    (["--image", IMAGE, "--recipe", "Qwen3-235B-A22B"], "scripts/run_qwen3_235b_a22b.py"),
    (["--image", IMAGE, "-F", "kuberay"], "Polyaxon job only"),
    (["--image", "radixark/miles:latest"], "not pinned by digest"),
    ([], "no image"),
])
def test_refusals(cli, clean_env, args, message):
    code, _, err = render(cli, *args)
    assert code == 2 and message in err, err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_external_ray_env_refused(cli, clean_env):
    Path("miles-ray.yaml").write_text("env: {MILES_SCRIPT_EXTERNAL_RAY: '1'}\n")
    code, _, err = render(cli, "--image", IMAGE)
    assert code == 2 and "MILES_SCRIPT_EXTERNAL_RAY" in err


def test_out_dir_and_validated_by_polyaxon(cli, clean_env):
    from miles_ray.adapters.polyaxon_spec import validate_operation

    code, _, err = render(cli, "--image", IMAGE, "--out", "manifests")
    assert code == 0, err
    [f] = Path("manifests").iterdir()
    assert f.name == "miles.single-node.polyaxon.yaml"
    validate_operation(yaml.safe_load(f.read_text()))  # raises SpecError if Polyaxon rejects it


# -- up --single-node against the real Polyaxon API server ----------------------------------------------------

@pytest.fixture
def px(polyaxon_server, monkeypatch, tmp_path):
    server = polyaxon_server
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", server.host)
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(server.connections))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS", "KUBECONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-single\n")
    server.create_project("miles-single")
    return server


@pytest.mark.polyaxon
def test_up_single_node_creates_and_compiles(px, cli):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    args = ["up", "--single-node", "--image", IMAGE, "--name", "single-one", "-c", "px.yaml", "--no-wait", "-o", "json"]
    code, out, err = cli(*args)
    assert code == 0, err
    result = json.loads(out)
    uuid = result["polyaxon_uuid"]
    api = PolyaxonApi(host=px.host)
    run = api.wait_for_status("default", "miles-single", uuid, {"queued"}, timeout=30)  # no agent: it stays
    assert run["status"] == "queued"
    sent = run["raw_content"]
    sent = json.loads(sent) if isinstance(sent, str) else sent
    assert sent["component"]["run"]["kind"] == "job"
    assert sent["component"]["run"]["container"]["args"][-1] == "/mnt/miles/runs/{{ globals.uuid }}"
    # the server compiled it: the template resolved to this run's uuid
    content = run["content"]
    content = json.loads(content) if isinstance(content, str) else content
    assert json.dumps(content).count(f"/mnt/miles/runs/{uuid}") >= 1, content
    # idempotent: the same job again is the same run
    code, out, err = cli(*args)
    assert code == 0, err
    assert json.loads(out)["polyaxon_uuid"] == uuid


@pytest.mark.polyaxon
def test_up_single_node_unknown_connection_refused_before_creation(px, cli, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-single\nconnection: nope-data\n")
    code, _, err = cli("up", "--single-node", "--image", IMAGE, "--name", "single-bad", "-c", "px.yaml", "--no-wait")
    assert code == 1 and "does not know connection(s) nope-data" in err
    assert PolyaxonApi(host=px.host).runs_named("default", "miles-single", "single-bad") == []
