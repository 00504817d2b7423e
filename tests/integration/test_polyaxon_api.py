"""The Polyaxon API client against the REAL Polyaxon API server (haupt 2.18 sandbox)."""

from __future__ import annotations

import copy
import http.server
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from miles_ray.adapters import polyaxon_api as pa
from miles_ray.adapters import polyaxon_spec as ps
from miles_ray.core.errors import ClusterError, ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_polyaxon_spec import miles_operation  # noqa: E402

pytestmark = pytest.mark.polyaxon

OWNER = "default"


@pytest.fixture
def api(polyaxon_server) -> pa.PolyaxonApi:
    return pa.PolyaxonApi(polyaxon_server.host, retries=2, backoff=0.05)


@pytest.fixture
def project(polyaxon_server) -> str:
    name = f"miles-{uuid.uuid4().hex[:8]}"
    polyaxon_server.create_project(name, OWNER)
    return name


def test_sandbox_figures(polyaxon_server):
    rss = polyaxon_server.rss_bytes()
    print(f"\nhaupt sandbox: started in {polyaxon_server.start_seconds:.1f}s, RSS {rss / 2**20:.0f} MiB")
    assert polyaxon_server.host.startswith("http://127.0.0.1:")
    assert polyaxon_server.start_seconds < 60
    assert rss is None or rss < 1.5 * 2**30


def test_create_compiles_and_queues(api, project):
    op = miles_operation()
    t0 = time.monotonic()
    run_uuid = api.create_operation(
        OWNER, project, op, tags=["miles-ray"], meta={"miles_ray": {"plan": "4x8"}}
    )
    created = time.monotonic() - t0
    run = api.wait_for_status(OWNER, project, run_uuid, {"queued"}, timeout=30)
    print(f"\ncreate+compile {created:.2f}s")
    assert run["name"] == "miles-qwen3-4b"
    assert run["runtime"] == "raycluster"
    assert run["tags"] == ["miles-ray"]
    assert run["meta_info"] == {"miles_ray": {"plan": "4x8"}}
    # read back: the operation as sent, verbatim
    assert run["raw_content"] == op
    # the server compiled it: contexts resolved per run
    head_env = {e["name"]: e.get("value") for e in run["content"]["run"]["head"]["container"]["env"]}
    assert head_env["MILES_OUTPUT_DIR"] == f"/mnt/miles/runs/{run_uuid}"
    conds = [c["type"] for c in api.get_run(OWNER, project, run_uuid)["conditions"]]
    assert conds[:3] == ["created", "compiled", "queued"]


def test_offline_conversion_matches_the_agents(api, project, polyaxon_server, monkeypatch):
    """What to_custom_resource predicts == what the agent builds from the server's compiled run.
    The agent writes its own client host into the pods (POLYAXON_HOST): both sides are given the server's, so
    a host another test left in polyaxon's process-wide settings cannot decide the outcome."""
    from polyaxon import settings
    from polyaxon._k8s.executor.executor import Executor
    from polyaxon._schemas.agent import AgentConfig

    op = miles_operation()
    run_uuid = api.create_operation(OWNER, project, op)
    run = api.get_run(OWNER, project, run_uuid)
    namespace = run["namespace"] or "polyaxon"
    agent = AgentConfig.from_dict(
        {"namespace": namespace, "artifactsStore": ps.DEFAULT_ARTIFACTS_STORE,
         "connections": ps.DEFAULT_CONNECTIONS}
    )
    previous = settings.AGENT_CONFIG
    settings.AGENT_CONFIG = agent
    monkeypatch.setattr(settings.CLIENT_CONFIG, "host", polyaxon_server.host)
    try:
        agent_cr = Executor.convert(
            owner_name=OWNER, project_name=project, run_name=run["name"], run_uuid=run_uuid,
            content=json.dumps(run["content"]), default_auth=False, agent_content=agent.to_json(),
        )
    finally:
        settings.AGENT_CONFIG = previous
    offline = ps.to_custom_resource(op, namespace, run_uuid, run["name"], project, owner=OWNER,
                                    polyaxon_host=polyaxon_server.host)
    assert settings.CLIENT_CONFIG.host == polyaxon_server.host  # to_custom_resource restored it
    assert json.loads(json.dumps(agent_cr)) == offline


def test_create_is_idempotent_by_name(api, project):
    op = miles_operation()
    first = api.create_operation(OWNER, project, op)
    again = api.create_operation(OWNER, project, op)
    assert again == first
    assert [r["uuid"] for r in api.runs_named(OWNER, project, "miles-qwen3-4b")
            if r["status"] not in pa.FINAL_STATUSES] == [first]  # one live run of that name: the first
    forced = api.create_operation(OWNER, project, op, reuse_existing=False)
    assert forced != first
    changed = copy.deepcopy(op)
    changed["component"]["run"]["workers"]["gpu"]["replicas"] = 2
    with pytest.raises(ClusterError, match="different operation"):
        api.create_operation(OWNER, project, changed)


def test_missing_project(api):
    with pytest.raises(ClusterError) as info:
        api.check_project(OWNER, "no-such-project")
    assert "no-such-project" in str(info.value) and "not found" in str(info.value)
    assert info.value.exit_code == 1
    with pytest.raises(ClusterError, match="not found"):
        api.create_operation(OWNER, "no-such-project", miles_operation())


def _with_connection(name: str) -> dict:
    op = miles_operation()
    op["name"] = f"conn-{name}"
    op["component"]["run"]["workers"]["gpu"]["connections"] = [name]
    return op


def test_unknown_connection_reported_by_the_server(api, project, monkeypatch):
    monkeypatch.delenv("POLYAXON_AGENT_CONNECTIONS", raising=False)
    with pytest.raises(ClusterError) as info:
        api.create_operation(OWNER, project, _with_connection("nope-data"))
    assert "nope-data" in str(info.value) and "connection" in str(info.value)


def test_unknown_connection_reported_before_creation(api, project, monkeypatch):
    op = _with_connection("nope-data")
    with pytest.raises(ClusterError, match="nope-data"):
        api.create_operation(OWNER, project, op, known_connections=["miles-data"])
    monkeypatch.setenv("POLYAXON_AGENT_CONNECTIONS", json.dumps(polyaxon_connections()))
    assert pa.list_agent_connections() == ["miles-data"]
    with pytest.raises(ClusterError, match="nope-data"):
        api.create_operation(OWNER, project, op)
    assert api.runs_named(OWNER, project, op["name"]) == []


def polyaxon_connections() -> list[dict]:
    return copy.deepcopy(ps.DEFAULT_CONNECTIONS)


def test_stop_and_delete(api, project):
    run_uuid = api.create_operation(OWNER, project, miles_operation())
    # A queued run is handed to the agent, so stopping it waits for the agent: "stopping" (a run still
    # created/compiled would be stopped on the spot). Wait for queued, then the outcome is exact.
    api.wait_for_status(OWNER, project, run_uuid, {"queued"}, timeout=30)
    api.stop_run(OWNER, project, run_uuid)
    assert api.get_run(OWNER, project, run_uuid)["status"] == "stopping"
    api.delete_run(OWNER, project, run_uuid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if api.runs_named(OWNER, project, "miles-qwen3-4b") == []:
            break
        time.sleep(0.2)
    else:
        pytest.fail("deleted run still listed")
    api.delete_run(OWNER, project, run_uuid)  # deleting again: fine
    # with no agent to finish the deletion, the run stays readable and flagged as deleting
    assert api.get_run(OWNER, project, run_uuid)["deleting"] is True
    with pytest.raises(ClusterError, match="not found"):
        api.get_run(OWNER, project, uuid.uuid4().hex)


def test_a_client_without_a_host_uses_polyaxon_host(polyaxon_server, project, monkeypatch):
    monkeypatch.setenv("POLYAXON_HOST", polyaxon_server.host)
    api = pa.PolyaxonApi(None)
    assert api.check_project(OWNER, project)["name"] == project
    run_uuid = api.create_operation(OWNER, project, miles_operation(), name="via-env")
    assert api.get_run(OWNER, project, run_uuid)["name"] == "via-env"
    monkeypatch.delenv("POLYAXON_HOST")
    with pytest.raises(ConfigError, match="POLYAXON_HOST"):
        pa.PolyaxonApi(None)


# ------------------------------------------------------------------ failures and retries


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_bounded_retries():
    host = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    api = pa.PolyaxonApi(host, retries=2, backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as info:
        api.check_project(OWNER, "miles")
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert "unreachable" in msg and "3 attempt(s)" in msg and "Connection refused" in msg, msg
    assert "\n" not in msg
    assert info.value.exit_code == 1
    assert elapsed < 5


class _Flaky:
    """A real HTTP front on 127.0.0.1 that answers 503 to the first ``failures`` requests, then
    forwards to the sandbox."""

    def __init__(self, upstream: str, failures: int, lose_posts: int = 0, refuse_posts: int = 0) -> None:
        self.upstream, self.failures, self.seen = upstream, failures, 0
        self.lose_posts = lose_posts  # forward this many POSTs, then answer 502 (response lost)
        self.refuse_posts = refuse_posts  # answer 405 to this many POSTs without forwarding (as the sandbox does)
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _handle(self):
                flaky.seen += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if self.command == "POST" and flaky.refuse_posts > 0:
                    flaky.refuse_posts -= 1
                    self.send_response(405)
                    self.send_header("Allow", "GET, HEAD, OPTIONS")
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"detail": "Method \\"POST\\" not allowed."}')
                    return
                if flaky.seen <= flaky.failures:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"detail": "temporarily unavailable"}')
                    return
                req = urllib.request.Request(flaky.upstream + self.path, data=body, method=self.command)
                req.add_header("Content-Type", self.headers.get("Content-Type") or "application/json")
                encoding = None
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        status, data = r.status, r.read()
                        encoding = r.headers.get("Content-Encoding")
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                    encoding = e.headers.get("Content-Encoding")
                if self.command == "POST" and flaky.lose_posts > 0:
                    flaky.lose_posts -= 1
                    status, data, encoding = 502, b'{"detail": "bad gateway"}', None
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky(polyaxon_server) -> Iterator:
    made = []

    def make(failures: int, lose_posts: int = 0, refuse_posts: int = 0) -> _Flaky:
        f = _Flaky(polyaxon_server.host, failures, lose_posts, refuse_posts)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def test_5xx_is_retried_then_succeeds(flaky, project):
    front = flaky(failures=2)
    api = pa.PolyaxonApi(front.host, retries=2, backoff=0.05)
    assert api.check_project(OWNER, project)["name"] == project
    assert front.seen == 3


def test_5xx_exhausts_bounded_retries(flaky):
    front = flaky(failures=100)
    api = pa.PolyaxonApi(front.host, retries=3, backoff=0.01)
    with pytest.raises(ClusterError) as info:
        api.check_project(OWNER, "miles")
    assert front.seen == 4
    assert "HTTP 503" in str(info.value) and "4 attempt(s)" in str(info.value)


def test_create_retried_after_lost_response_does_not_duplicate(flaky, project, polyaxon_server):
    # the server creates the run but the client sees a 502: the retry must find it, not re-create
    front = flaky(failures=0, lose_posts=1)
    api = pa.PolyaxonApi(front.host, retries=2, backoff=0.05)
    run_uuid = api.create_operation(OWNER, project, miles_operation(), name="retried")
    direct = pa.PolyaxonApi(polyaxon_server.host)
    rc_list = direct.run_client(OWNER, project).list(query="name:retried", limit=10).results
    assert [r.uuid for r in rc_list] == [run_uuid]


def test_create_refused_with_405_is_retried_once_created(flaky, project, polyaxon_server):
    # the sandbox's 405 to a POST served beside another POST: nothing was created, so the retry creates it, once
    front = flaky(failures=0, refuse_posts=2)
    api = pa.PolyaxonApi(front.host, retries=3, backoff=0.05)
    run_uuid = api.create_operation(OWNER, project, miles_operation(), name="refused")
    assert front.refuse_posts == 0  # both 405s were answered, then the create went through
    direct = pa.PolyaxonApi(polyaxon_server.host)
    rc_list = direct.run_client(OWNER, project).list(query="name:refused", limit=10).results
    assert [r.uuid for r in rc_list] == [run_uuid]
