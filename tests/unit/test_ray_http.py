"""The run controller's one Ray client (miles_ray/controller/ray_http.py) and the CLI's adapter over it
(adapters/ray_jobs.py: one typed error per failure), against the fake head of tests/infra/fake_ray_head.py (a real
HTTP server on loopback; the real Ray head: tests/integration)."""

from __future__ import annotations

import socket

import pytest

from miles_ray.adapters import ray_jobs
from miles_ray.controller import ray_http
from miles_ray.core.errors import Forbidden, NotFound, Unreachable
from tests.infra.fake_ray_head import FakeRayHead, node

JOB = {"submission_id": "s-1", "job_id": "02000000", "status": "RUNNING", "entrypoint": "python3 train.py",
       "start_time": 1_000, "driver_node_id": "H", "logs": "step 0: {}\n"}


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_client_reads_submits_and_stops_jobs_and_reads_nodes_with_their_start_times():
    with FakeRayHead(rows=[node("H", gpus=0, head=True, started=7)], jobs={"s-1": dict(JOB)}) as fake:
        head = ray_http.RayHead(fake.url + "/")
        assert [j["submission_id"] for j in head.jobs()] == ["s-1"]
        assert head.job("s-1")["status"] == "RUNNING" and head.job("nope") is None
        assert head.logs("s-1") == "step 0: {}\n"
        assert head.submit("s-2", "python3 x.py", metadata={"run": "r"}) == (True, "submitted")
        created, said = head.submit("s-2", "python3 x.py")
        assert not created and said.startswith("HTTP 400")
        assert head.stop("s-2") is True and head.stop("s-2") is False  # stopped, then already ended
        with pytest.raises(ray_http.Answered) as e:
            head.stop("nope")
        assert e.value.status == 404
        assert head.nodes()[0]["start_time_ms"] == 7
        assert "start_time_ms" not in head.nodes(detail=False)[0]  # Ray gives it only with detail=true


@pytest.mark.parametrize("status, error", [(401, ray_http.Refused), (403, ray_http.Refused),
                                           (503, ray_http.Answered)])
def test_a_head_that_refuses_or_fails_is_one_typed_error(status, error):
    with FakeRayHead(status=status) as fake:
        with pytest.raises(error) as e:
            ray_http.RayHead(fake.url).nodes()
        assert e.value.status == status
        assert not ray_http.RayHead(fake.url).jobs_api_answers()


def test_no_answer_says_whether_the_connection_was_refused():
    with pytest.raises(ray_http.Unreachable) as e:
        ray_http.RayHead(_closed_port(), timeout=2).jobs()
    assert e.value.refused


def test_the_cli_adapter_types_each_failure():
    with FakeRayHead(jobs={"s-1": dict(JOB)}, rows=[node("H", gpus=0, head=True, started=7_000)]) as fake:
        info = ray_jobs.status(fake.url, "s-1")
        assert (info["job_id"], info["ray_job_id"], info["status"], info["driver_node_id"]) == (
            "s-1", "02000000", "RUNNING", "H")
        assert [j["job_id"] for j in ray_jobs.list_jobs(fake.url)] == ["s-1"]
        assert ray_jobs.logs(fake.url, "s-1") == "step 0: {}\n"
        assert ray_jobs.stop(fake.url, "s-1") is True
        with pytest.raises(NotFound, match="status of job nope: no such job on"):
            ray_jobs.status(fake.url, "nope")
        with pytest.raises(NotFound):
            ray_jobs.logs(fake.url, "nope")
        assert ray_jobs.head_node(fake.url) == {"node_id": "H", "start_time_ms": 7_000, "alive": ["H"]}
        fake.status = 403
        with pytest.raises(Forbidden, match="refused listing jobs with a Ray token it does not accept"):
            ray_jobs.list_jobs(fake.url)
    with pytest.raises(Unreachable, match="cannot reach the Ray Jobs API at"):
        ray_jobs.status(_closed_port(), "s-1")
