"""Bad input on the Polyaxon path, against the real Polyaxon API server (haupt sandbox): each is refused in ONE
``error:`` line saying what is wrong and what to do, a non-zero exit, no traceback, and NOTHING created -- no run
in Polyaxon, no record in the state dir:

- a project that does not exist; a project that exists but takes no run (archived: the server itself answers
  such a create with a bare 404 'not found', so the product reads the project's state first);
- a connection the agent does not know (before creation, from POLYAXON_AGENT_CONNECTIONS);
- a host that does not answer;
- an operation the server rejects, its own message quoted: at creation (the server's validation) and at
  compilation (the run the server made is deleted again).

Runs without a kubeconfig (a Polyaxon user without kubectl), so the server is the only thing contacted.
(tests/e2e/test_polyaxon_up.py holds the Ray token Secret's checks; tests/realpods/test_polyaxon_path.py the
pods' service account's.)"""

from __future__ import annotations

import copy
import json
import urllib.request

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.polyaxon

PROJECT = "miles-badin"


@pytest.fixture
def env(polyaxon_server, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-dir" / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project(PROJECT)
    return tmp_path


def up(name: str, *extra: str) -> list[str]:
    return ["up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
            "--namespace", "ml", "--name", name, "-c", "px.yaml", "--no-wait", *extra]


def refused(code: int, err: str) -> str:
    """The one error line of a refusal (and that it is one, with no traceback)."""
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


def nothing_created(polyaxon_server, env, project: str, name: str) -> bool:
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    runs = PolyaxonApi(host=polyaxon_server.host).runs_named("default", project, name)
    return runs == [] and not list((env / "state").rglob(f"{name}.json"))


def test_a_project_that_does_not_exist(env, polyaxon_server, cli):
    (env / "px.yaml").write_text("polyaxon_project: no-such-project\n")
    code, _, err = cli(*up("bad-proj"))
    line = refused(code, err)
    assert "Polyaxon project default/no-such-project not found" in line, line
    assert "polyaxon project create --name no-such-project" in err
    assert not list((env / "state").rglob("bad-proj.json"))


def test_an_archived_project_takes_no_run(env, polyaxon_server, cli):
    polyaxon_server.create_project("miles-archived")

    def post(action: str) -> None:
        req = urllib.request.Request(f"{polyaxon_server.host}/api/v1/default/miles-archived/{action}", data=b"{}",
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    post("archive")
    (env / "px.yaml").write_text("polyaxon_project: miles-archived\n")
    code, _, err = cli(*up("arch"))
    line = refused(code, err)
    assert "Polyaxon project default/miles-archived" in line and "is archived" in line, line
    assert "polyaxon project restore" in err
    post("restore")  # an archived project lists no runs at all (404): look once it is live again
    assert nothing_created(polyaxon_server, env, "miles-archived", "arch")


def test_a_connection_the_agent_does_not_know(env, polyaxon_server, cli):
    (env / "px.yaml").write_text(f"polyaxon_project: {PROJECT}\nconnection: no-such-data\n")
    code, _, err = cli(*up("bad-conn"))
    line = refused(code, err)
    assert "does not know connection(s) no-such-data (known: miles-data)" in line, line
    assert nothing_created(polyaxon_server, env, PROJECT, "bad-conn")


def test_a_host_that_does_not_answer(env, polyaxon_server, cli, monkeypatch):
    monkeypatch.setenv("POLYAXON_HOST", "http://127.0.0.1:9")
    (env / "px.yaml").write_text(f"polyaxon_project: {PROJECT}\n")
    code, _, err = cli(*up("no-host"))
    line = refused(code, err)
    assert "Polyaxon API at http://127.0.0.1:9 unreachable" in line and "Connection refused" in line, line
    assert "is the Polyaxon server running?" in err
    assert nothing_created(polyaxon_server, env, PROJECT, "no-host")


def _operation(name: str) -> dict:
    from miles_ray.core.builders import build_operation
    from miles_ray.core.config import load_config
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN

    cfg = load_config({"recipe": "Qwen3-4B", "nodes": 2, "name": name, "namespace": "ml", "image": IMAGE,
                       "ray_version": "2.60.0", "polyaxon_project": PROJECT}, environ={})
    return build_operation(cfg, plan_split(BUILTIN["Qwen3-4B"], 2, cfg.gpus_per_node), IMAGE, "2.60.0")


def test_an_operation_the_server_rejects_is_quoted_and_leaves_nothing(env, polyaxon_server):
    """The server's compiler refuses it (a required input without a value): the run exists for a moment, failed,
    and is deleted again; the error quotes the server's own words."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.core.errors import ClusterError

    api = PolyaxonApi(host=polyaxon_server.host)
    op = copy.deepcopy(_operation("rejected-input"))
    op["component"]["inputs"] = [{"name": "dataset", "type": "str", "isOptional": False}]
    with pytest.raises(ClusterError) as info:
        api.create_operation("default", PROJECT, op, name="rejected-input", known_connections=["miles-data"])
    msg = str(info.value)
    assert msg.startswith("Polyaxon refused the operation: ") and "non optional inputs" in msg, msg
    assert "deleted again, nothing is left" in msg
    assert [r for r in api.runs_named("default", PROJECT, "rejected-input") if not r.get("deleting")] == []
