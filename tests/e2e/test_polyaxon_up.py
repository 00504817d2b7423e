"""`up --via polyaxon` against the real Polyaxon API server (haupt sandbox) with the real Kubernetes
control plane for the preflight. The sandbox has no agent, so the operation is created, compiled and
queued but never turned into pods here (said in the closing notes)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE
from tests.infra.fixtures import ray_token_secret
from tests.infra.haupt import grant_runs_rbac

pytestmark = pytest.mark.e2e


@pytest.fixture
def px_env(fake_k8s, polyaxon_server, monkeypatch, tmp_path, namespace, k8s_api):
    monkeypatch.setenv("KUBECONFIG", str(fake_k8s.kubeconfig))
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    # what the agent knows, so unknown connections are refused before anything is created
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project("miles-e2e")
    grant_runs_rbac(k8s_api, namespace)  # what Polyaxon's sidecar needs of the pods' service account (checked by up)
    return polyaxon_server


def args(namespace: str, name: str, *extra: str) -> list[str]:
    return ["up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
            "--namespace", namespace, "--name", name, "-c", "px.yaml", "--no-wait", "-o", "json", *extra]


def test_up_via_polyaxon_creates_the_operation(px_env, cli, core_v1, namespace, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    ray_token_secret(core_v1, namespace, "px-two")  # what the operation's pods read RAY_AUTH_TOKEN from
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
    # what the server holds is what the flags asked for (facts stated here, not rebuilt by the product's code) ...
    sent = run["raw_content"]
    sent = json.loads(sent) if isinstance(sent, str) else sent
    held = sent["component"]["run"]
    assert held["kind"] == "raycluster" and held["rayVersion"] == "2.60.0"
    [workers] = held["workers"].values()
    assert workers["replicas"] == 2                                                  # --nodes 2
    assert held["head"]["container"]["image"] == workers["container"]["image"] == IMAGE  # one pinned image
    assert workers["container"]["resources"]["limits"]["nvidia.com/gpu"] == "8"       # gpus_per_node default
    assert "nvidia.com/gpu" not in (held["head"]["container"].get("resources") or {}).get("limits", {})
    assert held["head"]["connections"] == workers.get("connections")                  # the same mounts
    # ... and is what 'render' shows for the same flags (one document pipeline)
    code, rendered, err = cli("render", "-F", "polyaxon", "-o", "json", "--nodes", "2", "--image", IMAGE,
                              "--ray-version", "2.60.0", "--namespace", namespace, "--name", "px-two", "-c", "px.yaml")
    assert code == 0, err
    assert held == json.loads(rendered)["component"]["run"]
    # idempotent: up again finds the same run
    code, out, err = cli(*args(namespace, "px-two"))
    assert code == 0, err
    assert json.loads(out)["polyaxon_uuid"] == uuid
    # another size is refused (exit 2) naming the fix, as on the local and KubeRay backends; nothing created
    code, _, err = cli(*args(namespace, "px-two", "--nodes", "4"))
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "nodes 2 != 4" in lines[0], err
    assert "'miles-ray scale --nodes 4'" in lines[0] and "--nodes 2" in lines[0]
    assert [r["uuid"] for r in api.runs_named("default", "miles-e2e", "px-two")] == [uuid]  # no second run
    # down twice: the second one finds it already down and exits 0 ('trap "miles-ray down -y" EXIT')
    down = ["down", "-y", "--backend", "kubernetes", "--namespace", namespace, "--name", "px-two", "-c", "px.yaml"]
    code, _, err = cli(*down)
    assert code == 0, err
    code, out, err = cli(*down, "-o", "json")
    assert code == 0 and json.loads(out)["already_down"] is True, err


def test_unknown_connection_refused_before_creation(px_env, cli, core_v1, namespace, tmp_path):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    ray_token_secret(core_v1, namespace, "px-badconn")

    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\nconnection: no-such-data\n")
    code, _, err = cli(*args(namespace, "px-badconn"))
    assert code == 1
    assert "does not know connection(s) no-such-data" in err
    assert PolyaxonApi(host=px_env.host).runs_named("default", "miles-e2e", "px-badconn") == []


def test_missing_project_and_unreachable_server(px_env, cli, core_v1, namespace, tmp_path, monkeypatch):
    for name in ("px-noproj", "px-down"):
        ray_token_secret(core_v1, namespace, name)
    (tmp_path / "px.yaml").write_text("polyaxon_project: no-such-project\n")
    code, _, err = cli(*args(namespace, "px-noproj"))
    assert code == 1 and "no-such-project" in err
    monkeypatch.setenv("POLYAXON_HOST", "http://127.0.0.1:9")
    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    code, _, err = cli(*args(namespace, "px-down"))
    assert code == 1 and "unreachable" in err


def test_the_ray_token_secret_is_checked_before_anything_is_created(px_env, cli, core_v1, namespace, tmp_path):
    """The operation's head and workers read RAY_AUTH_TOKEN from the Secret (Polyaxon's RayCluster has no
    authOptions, so KubeRay makes none): up refuses, in one line saying how to create it, while it is missing or
    lacks the key -- nothing created in Polyaxon or the state dir -- and goes on once it is there. The token it
    read to check is printed nowhere."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(host=px_env.host)
    (tmp_path / "px.yaml").write_text("polyaxon_project: miles-e2e\n")
    outputs: list[str] = []

    def up(*extra: str) -> tuple[int, str, str]:
        code, out, err = cli(*args(namespace, "px-tok", *extra))
        outputs.extend([out, err])
        return code, out, err

    def nothing_created() -> bool:
        return (api.runs_named("default", "miles-e2e", "px-tok") == []
                and not list((tmp_path / "state").rglob("px-tok.json")))

    code, _, err = up()
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1, err
    assert f"the Ray token Secret {namespace}/px-tok does not exist" in line and "CreateContainerConfigError" in line
    assert f"kubectl -n {namespace} create secret generic px-tok --from-literal=auth_token=" in err
    assert nothing_created()
    code, _, err = up("--dry-run", "server")  # the server dry run's preflight says the same
    assert code == 1 and "does not exist" in err and nothing_created()
    code, _, err = up("--dry-run", "client")  # the client dry run contacts nothing, so checks no Secret
    assert code == 0 and "nothing contacted" in err and nothing_created(), err

    ray_token_secret(core_v1, namespace, "px-tok", key="token")  # the wrong key
    code, _, err = up()
    assert code == 1 and f"{namespace}/px-tok has no key auth_token" in err and nothing_created()

    core_v1.delete_namespaced_secret("px-tok", namespace)
    token = ray_token_secret(core_v1, namespace, "px-tok")
    code, out, err = up()
    assert code == 0, err
    result = json.loads(out)
    assert result["preflight"]["ray_token_secret"] == f"{namespace}/px-tok"
    run = api.wait_for_status("default", "miles-e2e", result["polyaxon_uuid"], {"queued"}, timeout=30)
    head = run["raw_content"]["component"]["run"]["head"]["container"]
    ref = next(e for e in head["env"] if e["name"] == "RAY_AUTH_TOKEN")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "px-tok", "key": "auth_token"}
    # the token itself: in no output, in nothing Polyaxon holds, in no state file
    state_files = [p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert not [blob for blob in [*outputs, json.dumps(run), *state_files] if token in blob]
