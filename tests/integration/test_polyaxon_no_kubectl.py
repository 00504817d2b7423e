"""A Polyaxon user without kubectl: KUBECONFIG points nowhere, and up / status / down / submit --mode launcher /
status RUN / logs RUN / stop RUN go through the real Polyaxon API server (haupt sandbox) alone.

The sandbox compiles and queues runs but has no agent executing them (tests/e2e/test_polyaxon_stack.py runs
its agent against the fake control plane, whose kwok pods run no containers), so no pod ever writes a log
line here. The logs test therefore FAKES the one thing a run's Polyaxon sidecar would do -- archive the
launcher container's lines (JSON lines, the sidecar's format) under the artifacts store at
``<run uuid>/plxlogs/`` -- and reads them back through Polyaxon's streams API like any user would."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.polyaxon

PROJECT = "miles-nokube"


@pytest.fixture
def nokube(polyaxon_server, monkeypatch, tmp_path):
    nowhere = tmp_path / "no-such-dir" / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(nowhere))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_server.connections))
    for key in ("MILES_RAY_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    polyaxon_server.create_project(PROJECT)
    (tmp_path / "px.yaml").write_text(f"polyaxon_project: {PROJECT}\n")
    return str(nowhere)


def cluster(name: str) -> list[str]:
    return ["--namespace", "ml", "--name", name, "-c", "px.yaml"]


def up(name: str, *extra: str) -> list[str]:
    return ["up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
            *cluster(name), *extra]


def notice_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("notice:")]


def test_up_status_down_through_polyaxon_only(nokube, polyaxon_server, cli):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(host=polyaxon_server.host)
    code, out, err = cli(*up("nk-a", "--dry-run", "client", "-o", "json"))
    assert code == 0, err
    assert json.loads(out)["created"] is False
    assert api.runs_named("default", PROJECT, "nk-a") == []

    t0 = time.monotonic()
    code, out, err = cli(*up("nk-a", "--no-wait", "-o", "json"))
    up_seconds = time.monotonic() - t0
    assert code == 0, err
    result = json.loads(out)
    uuid = result["polyaxon_uuid"]
    [notice] = notice_lines(err)
    assert nokube in notice and "Kubernetes preflight" in notice and "free GPU node" in notice
    assert "the Ray token Secret ml/nk-a (key auth_token" in notice  # the check it could not do, by name
    assert result["preflight"] == {"skipped": "no kubeconfig"} and result["raycluster"] == f"plx-operation-{uuid}"
    run = api.wait_for_status("default", PROJECT, uuid, {"queued"}, timeout=30)
    assert run["raw_content"]["component"]["run"]["kind"] == "raycluster"
    # up again: the same run, not a second one
    code, out, err = cli(*up("nk-a", "--no-wait", "-o", "json"))
    assert code == 0, err and json.loads(out)["polyaxon_uuid"] == uuid

    code, out, err = cli("status", "--backend", "kubernetes", *cluster("nk-a"), "-o", "json")
    assert code == 0, err
    st = json.loads(out)
    assert st["kubernetes"] is False and st["polyaxon_uuid"] == uuid and st["polyaxon_status"] == "queued"
    assert [c["type"] for c in st["polyaxon_conditions"]] == ["created", "compiled", "queued"]
    code, out, err = cli("status", "--backend", "kubernetes", *cluster("nk-a"))
    assert code == 0, err
    assert f"Polyaxon run {uuid}" in out and "queued" in out and len(notice_lines(err)) == 1

    # --wait without Kubernetes access waits on Polyaxon's view; with no agent the run stays queued
    code, out, err = cli(*up("nk-a", "--timeout", "3"))
    assert code == 1 and "is `queued` after 3s, wanted running" in err

    code, out, err = cli("down", "--backend", "kubernetes", *cluster("nk-a"), "--yes", "-o", "json")
    assert code == 0, err
    down = json.loads(out)
    assert down["polyaxon_stopped"] == uuid and down["polyaxon_deleted"] == uuid
    # stopping -> stopped: the sandbox's scheduler finalises a run no agent holds (~2 s cron)
    after = api.wait_for_status("default", PROJECT, uuid, {"stopped"}, timeout=30)
    assert after["deleting"] is True
    assert api.runs_named("default", PROJECT, "nk-a") == []

    # status after down: what Polyaxon says of the run down stopped and deleted -- no kubeconfig needed
    code, out, err = cli("status", "--backend", "kubernetes", *cluster("nk-a"), "-o", "json")
    assert code == 0, err
    st = json.loads(out)
    assert st["state"] == "down" and st["polyaxon_uuid"] == uuid and "kubeconfig" not in err
    assert st["polyaxon_status"] in ("stopped", None) and st["polyaxon_deleting"] is True
    code, out, err = cli("status", "--backend", "kubernetes", *cluster("nk-a"))
    assert code == 0, err
    assert f"cluster nk-a: down since" in out and f"Polyaxon run {uuid}" in out and "deleted" in out
    # down again: nothing to do, said in one line
    code, out, err = cli("down", "--backend", "kubernetes", *cluster("nk-a"), "--yes")
    assert code == 0 and "nothing to do" in err, err
    # up again makes a new run, and status shows that one
    code, out, err = cli(*up("nk-a", "--no-wait", "-o", "json"))
    assert code == 0, err
    again = json.loads(out)["polyaxon_uuid"]
    assert again != uuid
    code, out, err = cli("status", "--backend", "kubernetes", *cluster("nk-a"), "-o", "json")
    assert code == 0 and json.loads(out)["polyaxon_uuid"] == again and "state" not in json.loads(out)
    code, out, err = cli("down", "--backend", "kubernetes", *cluster("nk-a"), "--yes")
    assert code == 0, err
    print(f"\nup --via polyaxon without kubeconfig: {up_seconds:.1f}s to a created run")


def test_explicit_missing_kubeconfig_is_still_an_error(nokube, cli, tmp_path):
    code, _, err = cli(*up("nk-b", "--no-wait", "--kubeconfig", str(tmp_path / "typo.yaml")))
    assert code == 2 and "typo.yaml does not exist" in err


def test_launcher_job_status_logs_stop_through_polyaxon(nokube, polyaxon_server, cli):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(host=polyaxon_server.host)
    code, out, err = cli(*up("nk-l", "--no-wait", "-o", "json"))
    assert code == 0, err
    cluster_uuid = json.loads(out)["polyaxon_uuid"]

    code, out, err = cli("submit", "--mode", "launcher", "--run", "nkl-1", "--nodes", "2", "--image", IMAGE,
                         *cluster("nk-l"), "-o", "json")
    assert code == 0, err
    sub = json.loads(out)
    uuid = sub["polyaxon_uuid"]
    [notice] = notice_lines(err)
    assert nokube in notice and "topology" in notice and "data preflight" in notice
    assert "the Ray token Secret ml/nk-l the job reads" in notice
    run = api.wait_for_status("default", PROJECT, uuid, {"queued"}, timeout=30)
    c = run["raw_content"]["component"]["run"]
    env = {e["name"]: e.get("value") for e in c["container"]["env"]}
    assert c["kind"] == "job" and env["MILES_SCRIPT_EXTERNAL_RAY"] == "1"
    assert env["RAY_ADDRESS"] == f"http://plx-operation-{cluster_uuid}-head-svc.ml.svc:8265"

    code, out, err = cli("status", "nkl-1", "-o", "json")
    assert code == 5, err  # pending
    st = json.loads(out)
    assert st["status"] == "PENDING" and st["polyaxon_status"] == "queued" and st["submission_id"] == f"polyaxon:{uuid}"

    code, out, err = cli("logs", "nkl-1", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["logs"] == ""

    # FAKE: what the run's Polyaxon sidecar archives (no container runs here); a line that is only a number
    # is kept (the polyaxon CLI's own 'ops logs' crashes on one)
    logs_dir = polyaxon_server.path / uuid / "plxlogs"
    logs_dir.mkdir(parents=True)
    lines = ["launcher: MILES_SCRIPT_EXTERNAL_RAY=1, submitting to the head", "42", "launcher: job submitted"]
    (logs_dir / f"plx-operation-{uuid}-main.jsonl").write_text("".join(
        json.dumps({"timestamp": f"2026-12-03T10:40:0{i}+00:00", "node": "gpu-node-0", "pod": f"plx-operation-{uuid}",
                    "container": "polyaxon-main", "value": v}) + "\n" for i, v in enumerate(lines)))
    code, out, err = cli("logs", "nkl-1")
    assert code == 0, err
    assert out.splitlines() == lines

    # stop through Polyaxon; once stopped, following ends at once with the job's state (exit 6: stopped)
    code, out, err = cli("stop", "nkl-1", "--yes", "-o", "json")
    assert code == 0, err
    assert api.get_run("default", PROJECT, uuid, with_conditions=False)["status"] == "stopping"
    # FAKE agent: the sandbox leaves a stopping job there (its agent would kill the pod and report); report it
    api.run_client("default", PROJECT, uuid).log_status("stopped", reason="AgentStopped", message="pod deleted")
    api.wait_for_status("default", PROJECT, uuid, {"stopped"}, timeout=30)
    code, out, err = cli("status", "nkl-1")
    assert code == 6 and "STOPPED" in out
    code, out, err = cli("logs", "nkl-1", "--follow")
    assert code == 6 and out.splitlines() == lines and "run nkl-1: STOPPED" in err


def _job_auth(api, uuid: str) -> dict:
    run = api.wait_for_status("default", PROJECT, uuid, {"queued"}, timeout=30)
    env = run["raw_content"]["component"]["run"]["container"]["env"]
    return {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"] for e in env if e["name"].startswith("RAY_AUTH")}


def test_the_launcher_job_names_the_token_secret_of_the_cluster_it_targets(nokube, polyaxon_server, cli, tmp_path):
    """Without kubeconfig the launcher job's Secret comes from this machine's record of the targeted cluster: the
    Secret its operation references (also one set with ray_auth_secret at up, whatever the submit's config
    says), the one KubeRay makes for another RayCluster given by --address, none for a cluster made with
    --ray-auth none; a head in another namespace is refused (the job's pod could not read its Secret)."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(host=polyaxon_server.host)
    (tmp_path / "team.yaml").write_text(f"polyaxon_project: {PROJECT}\nray_auth_secret: team-ray-token\n")
    code, out, err = cli("up", "--via", "polyaxon", "--nodes", "2", "--image", IMAGE, "--ray-version", "2.60.0",
                         "--namespace", "ml", "--name", "nk-t", "-c", "team.yaml", "--no-wait", "-o", "json")
    assert code == 0, err
    assert "the Ray token Secret ml/team-ray-token" in notice_lines(err)[0]

    def submit(run: str, *extra: str) -> tuple[int, dict, str]:
        code, out, err = cli("submit", "--mode", "launcher", "--run", run, "--nodes", "2", "--image", IMAGE,
                             "--namespace", "ml", "-c", "px.yaml", *extra, "-o", "json")
        return code, (json.loads(out) if code == 0 else {}), err

    # the submit's config has no ray_auth_secret: the record of 'up' says which Secret the head reads
    code, sub, err = submit("nkt-1", "--name", "nk-t")
    assert code == 0, err
    assert _job_auth(api, sub["polyaxon_uuid"]) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": {
        "name": "team-ray-token", "key": "auth_token"}}
    # another RayCluster by address (a KubeRay one: its Secret is named after it), whatever --name says
    code, sub, err = submit("nkt-2", "--name", "nk-t", "--address", "k8s://ml/kr-other")
    assert code == 0, err
    assert _job_auth(api, sub["polyaxon_uuid"])["RAY_AUTH_TOKEN"] == {"name": "kr-other", "key": "auth_token"}
    # a cluster made without auth: the job runs its ray commands without it (no Secret to miss)
    code, out, err = cli(*up("nk-n", "--ray-auth", "none", "--no-wait"))
    assert code == 0 and "ray_auth is none" in err, err
    code, sub, err = submit("nkt-3", "--name", "nk-n")
    assert code == 0, err
    assert _job_auth(api, sub["polyaxon_uuid"]) == {"RAY_AUTH_MODE": "disabled"}
    # a head in another namespace than the job's
    code, _, err = submit("nkt-4", "--name", "nk-t", "--address", "k8s://other-ns/kr-other")
    assert code == 2 and "a pod can only read Secrets of its own namespace" in err, err
    assert api.runs_named("default", PROJECT, "nk-t-nkt-4") == []


def test_up_single_node_without_kubeconfig_names_the_token_secret_it_could_not_check(nokube, polyaxon_server, cli):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    code, out, err = cli("up", "--single-node", "--image", IMAGE, "--namespace", "ml", "--name", "nk-single",
                         "-c", "px.yaml", "--no-wait", "-o", "json")
    assert code == 0, err
    [notice] = notice_lines(err)
    assert nokube in notice and "the Ray token Secret ml/nk-single (key auth_token" in notice and "not checked" in notice
    run = PolyaxonApi(host=polyaxon_server.host).wait_for_status("default", PROJECT, json.loads(out)["polyaxon_uuid"],
                                                                 {"queued"}, timeout=30)
    env = {e["name"]: e for e in run["raw_content"]["component"]["run"]["container"]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "nk-single", "key": "auth_token"}
