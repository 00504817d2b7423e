"""A launcher run (submit --mode launcher on a Kubernetes head: a Polyaxon job) is reached again on the Polyaxon
host it was created on: its run record keeps that host, so 'status RUN', 'logs RUN' and 'stop RUN' need no
$POLYAXON_HOST when polyaxon_host was set only in miles-ray.yaml. Against the real Polyaxon API server (haupt
sandbox), with no kubeconfig (the launcher job is created through Polyaxon's API alone)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.polyaxon

PROJECT = "miles-hosted"


@pytest.fixture
def configured_host_only(polyaxon_server, monkeypatch, tmp_path):
    """polyaxon_host in miles-ray.yaml, not in the environment."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-dir" / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("POLYAXON_HOST", raising=False)
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project(PROJECT)
    (tmp_path / "miles-ray.yaml").write_text(f"polyaxon_project: {PROJECT}\npolyaxon_host: {polyaxon_server.host}\n")
    return tmp_path


def test_status_logs_stop_of_a_launcher_run_use_the_host_it_was_created_on(configured_host_only, polyaxon_server,
                                                                           cli, monkeypatch):
    from miles_ray.adapters import state
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(host=polyaxon_server.host)
    code, out, err = cli("up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
                         "--namespace", "ml", "--name", "hh", "--no-wait", "-o", "json")
    assert code == 0, err
    code, out, err = cli("submit", "--mode", "launcher", "--run", "hh-1", "--nodes", "2", "--image", IMAGE,
                         "--namespace", "ml", "--name", "hh", "-o", "json")
    assert code == 0, err
    uuid = json.loads(out)["polyaxon_uuid"]
    api.wait_for_status("default", PROJECT, uuid, {"queued"}, timeout=30)
    assert state.load_record("hh-1")["polyaxon_host"] == polyaxon_server.host

    code, out, err = cli("status", "hh-1", "-o", "json")
    assert code == 5, err  # pending: reached on the recorded host
    st = json.loads(out)
    assert st["polyaxon_status"] == "queued" and st["submission_id"] == f"polyaxon:{uuid}"
    code, out, err = cli("logs", "hh-1", "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {"run": "hh-1", "status": "PENDING", "logs": ""}
    code, out, err = cli("runs", "-o", "json")
    assert code == 0, err
    assert [r["status"] for r in json.loads(out) if r["run"] == "hh-1"] == ["PENDING"]
    code, out, err = cli("stop", "hh-1", "--yes", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["stopped"] is True
    assert api.get_run("default", PROJECT, uuid, with_conditions=False)["status"] == "stopping"

    # a record from before the host was kept: $POLYAXON_HOST as before, and without it an error saying what to do
    rec = state.load_record("hh-1")
    del rec["polyaxon_host"]
    state.save_record(rec)
    code, out, err = cli("status", "hh-1")
    assert code == 2 and "POLYAXON_HOST" in err and "--polyaxon-host" not in err, err
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    code, out, err = cli("status", "hh-1", "-o", "json")
    assert code == 5 and json.loads(out)["polyaxon_status"] == "stopping", err
