"""`up --via polyaxon` against the real Polyaxon API server (haupt sandbox) with the real Kubernetes
control plane for the preflight. The sandbox has no agent, so the operation is created, compiled and
queued but never turned into pods here (said in the closing notes)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.e2e


@pytest.fixture
def px_env(fake_k8s, polyaxon_server, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    # what the agent knows, so unknown connections are refused before anything is created
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project("miles-e2e")
    return polyaxon_server


def args(namespace: str, name: str, *extra: str) -> list[str]:
    return ["up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
            "--namespace", namespace, "--name", name, "-c", "px.yaml", "--no-wait", "-o", "json", *extra]


def test_up_via_polyaxon_creates_the_operation(px_env, cli, namespace, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.cli.render import build_documents
    from miles_ray.core.config import load_config

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    code, out, err = cli(*args(namespace, "px-two"))
    assert code == 0, err
    result = json.loads(out)
    uuid = result["polyaxon_uuid"]
    assert result["raycluster"] == f"plx-operation-{uuid}"
    api = PolyaxonApi(host=px_env.host)
    # created -> compiled -> queued; with no agent polling this server, queued is where the run stays
    run = api.wait_for_status("default", "miles-e2e", uuid, {"queued"}, timeout=30)
    assert run["status"] == "queued"
    assert [c["type"] for c in api.get_run("default", "miles-e2e", uuid)["conditions"]][-1] == "queued"
    # what the server holds is what we generated
    cfg = load_config({"nodes": 2, "image": IMAGE, "ray_version": "2.60.0", "namespace": namespace,
                       "name": "px-two", "polyaxon_project": "miles-e2e"}, environ={})
    docs, _, _ = build_documents(cfg, {"polyaxon"})
    sent = run["raw_content"]
    sent = json.loads(sent) if isinstance(sent, str) else sent
    assert sent["component"]["run"] == docs["polyaxon"]["component"]["run"]
    # idempotent: up again finds the same run
    code, out, err = cli(*args(namespace, "px-two"))
    assert code == 0, err
    assert json.loads(out)["polyaxon_uuid"] == uuid


def test_unknown_connection_refused_before_creation(px_env, cli, namespace, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\nconnection: no-such-data\n")
    code, _, err = cli(*args(namespace, "px-badconn"))
    assert code == 1
    assert "does not know connection(s) no-such-data" in err
    assert PolyaxonApi(host=px_env.host).find_run_by_name("default", "miles-e2e", "px-badconn", include_final=True) is None


def test_missing_project_and_unreachable_server(px_env, cli, namespace, tmp_path, monkeypatch):
    (tmp_path / "px.yaml").write_text("polyaxon_project: no-such-project\n")
    code, _, err = cli(*args(namespace, "px-noproj"))
    assert code == 1 and "no-such-project" in err
    monkeypatch.setenv("POLYAXON_HOST", "http://127.0.0.1:9")
    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    code, _, err = cli(*args(namespace, "px-down"))
    assert code == 1 and "unreachable" in err
