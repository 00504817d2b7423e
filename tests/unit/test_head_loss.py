"""Issue 27: a job that died with its head. The run record keeps the head its job started on (Ray's head node id,
the head pod's UID); the run verbs compare it with the head serving now, and a job whose head is gone is lost:
FAILED, "head lost at ...", never RUNNING; submit of the run starts its next attempt. The Jobs API and the head
are replaced here by stand-ins of their answers (the real ones: tests/integration/test_head_loss.py, and
tests/realpods/test_kubernetes_path.py on real pods)."""

from __future__ import annotations

import pytest

from miles_ray.adapters import ray_jobs, state
from miles_ray.core.config import load_config
from miles_ray.core.errors import JobFailed, NotFound
from miles_ray.core.runs import (attempt_submission_id, head_change, head_identity, lost_attempt, mark_lost,
                                 new_attempt)
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
from miles_ray.services.runs import ray_job
from miles_ray.services.runs.ray_job import RayJob
from tests.conftest import IMAGE

OLD = {"node_id": "a" * 56, "pod": "ml/q4-head-x", "pod_uid": "uid-old"}
NEW = {"node_id": "b" * 56, "pod": "ml/q4-head-y", "pod_uid": "uid-new"}
URL = "http://127.0.0.1:1"


def _record(**extra):
    rec = {"run": "r-1", "submission_id": "miles-ray-q4-r-1", "address": "k8s://ml/q4", "output_dir": "/o/r-1",
           "recipe": "Qwen3-4B", "mode": "direct", "created": "t0", "head": OLD,
           "attempts": [{"attempt": 1, "submission_id": "miles-ray-q4-r-1", "started": "t0", "head": OLD,
                         "resumed_from": None}]}
    return {**rec, **extra}


def test_a_head_is_the_same_only_with_the_same_pod_and_ray_head_node():
    assert head_change(OLD, OLD) is None
    assert head_change(None, NEW) is None  # a record older than head identities: nothing to compare
    why = head_change(OLD, NEW)
    assert why.startswith("head pod ml/q4-head-x (uid uid-old") and "the head now is head pod ml/q4-head-y" in why
    # Ray started again in the same pod (its container restarted): another head node
    assert "is gone" in head_change(OLD, {**OLD, "node_id": "c" * 56})
    local = head_identity("a" * 56)
    assert head_change(local, head_identity("d" * 56)).startswith("Ray head node aaaaaaaaaaaaaaaa is gone")
    assert head_change(local, head_identity(None)).endswith("no head is ALIVE now")


def test_attempts_number_their_submission_ids_and_mark_the_lost_one():
    assert attempt_submission_id("miles-ray-q4-r", 1) == "miles-ray-q4-r"
    assert attempt_submission_id("miles-ray-q4-r", 2) == "miles-ray-q4-r-a2"
    lost = mark_lost(_record(), "t1", "head pod gone", NEW)
    a = lost_attempt(lost)
    assert a["attempt"] == 1 and a["status"] == "FAILED" and a["ended"] == "t1" and a["serving_head"] == NEW
    assert a["reason"] == "head lost at t1: head pod gone"
    later = new_attempt(lost, "miles-ray-q4-r-1-a2", "t2", NEW, "/o/r-1/checkpoints")
    assert [x["attempt"] for x in later] == [1, 2] and later[1]["resumed_from"] == "/o/r-1/checkpoints"
    assert lost_attempt({**lost, "attempts": later}) is None


def _cfg():
    return load_config({"name": "q4", "namespace": "ml", "nodes": 2, "image": IMAGE}, environ={})


def test_the_next_attempt_of_a_lost_run_resumes_from_its_checkpoints():
    cfg = _cfg()
    valid = validate_request(cfg, SubmitRequest(run="r-1", mode="direct"))
    target = SubmitTarget("kuberay", "k8s://ml/q4")
    first = prepare_submit(cfg, valid, target, created="t0", launchers_dir="/unused")
    # the prepared record (dry runs print it) keeps its keys: the head and attempts are set on creation
    assert "head" not in first.record and "attempts" not in first.record
    made = first.with_head(OLD["node_id"], {"pod": OLD["pod"], "pod_uid": OLD["pod_uid"]}, "t0").record
    assert made["head"] == OLD and made["attempts"][0]["submission_id"] == "miles-ray-q4-r-1"
    lost = mark_lost(made, "t1", "gone", NEW)
    nxt = prepare_submit(cfg, valid, target, created="t2", launchers_dir="/unused", resume=lost, replaces=lost)
    assert nxt.attempt == 2 and nxt.submission_id == "miles-ray-q4-r-1-a2" == nxt.record["submission_id"]
    assert nxt.record["created"] == "t0" and nxt.output_dir == made["output_dir"]
    assert f"--load {made['checkpoint_dir']}" in nxt.entrypoint
    rec = nxt.with_head(NEW["node_id"], {"pod": NEW["pod"], "pod_uid": NEW["pod_uid"]}, "t2").record
    assert [(a["attempt"], a.get("lost")) for a in rec["attempts"]] == [(1, True), (2, None)]
    assert rec["attempts"][1]["resumed_from"] == made["checkpoint_dir"] and rec["head"] == NEW


@pytest.fixture
def head_now(monkeypatch, tmp_path):
    """The head serving now: NEW, with the given job info (None: it has no such job)."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ray_job, "serving_pod", lambda url: {"pod": NEW["pod"], "pod_uid": NEW["pod_uid"]})
    monkeypatch.setattr(ray_jobs, "head_node", lambda url, timeout=5: {"node_id": NEW["node_id"],
                                                                                 "alive": [NEW["node_id"], "w" * 56]})
    jobs = {}

    def status(url, job_id):
        if job_id not in jobs:
            raise NotFound(f"no such job {job_id}")
        return jobs[job_id]

    monkeypatch.setattr(ray_jobs, "status", status)
    return jobs


def _running(driver):
    return {"job_id": "miles-ray-q4-r-1", "status": "RUNNING", "message": "running", "driver_node_id": driver}


def test_a_job_still_running_on_a_gone_head_is_lost(head_now):
    """GCS fault tolerance keeps the job's entry RUNNING on the new head; its driver's node is not ALIVE."""
    head_now["miles-ray-q4-r-1"] = _running(OLD["node_id"])
    state.save_record(_record())
    st = RayJob(state.load_record("r-1"), url=URL).state()
    assert st.status == "FAILED" and st.message.startswith("head lost at ") and "uid uid-old" in st.message
    assert st.head_lost.head == OLD and st.head_lost.serving_head["pod_uid"] == "uid-new"
    kept = state.load_record("r-1")
    assert lost_attempt(kept)["reason"] == st.message  # kept: later reads need no head
    head_now.clear()
    assert RayJob(kept, url=URL).state().status == "FAILED"
    assert RayJob(kept, url=URL).live_state() == "FAILED"
    with pytest.raises(JobFailed, match="head lost at .*no copy was saved"):
        list(RayJob(kept, url=URL).logs(False))


def test_a_job_the_new_head_does_not_have_is_lost(head_now):
    state.save_record(_record())
    assert RayJob(state.load_record("r-1"), url=URL).live_state() == "FAILED"


@pytest.mark.parametrize("info, want", [
    ({"job_id": "miles-ray-q4-r-1", "status": "SUCCEEDED", "driver_node_id": OLD["node_id"]}, "SUCCEEDED"),
    (_running("w" * 56), "RUNNING"),  # its driver runs on a node ALIVE now: not lost
])
def test_an_ended_job_or_one_running_on_a_live_node_is_not_lost(head_now, info, want):
    head_now["miles-ray-q4-r-1"] = info
    state.save_record(_record())
    assert RayJob(state.load_record("r-1"), url=URL).state().status == want
    assert lost_attempt(state.load_record("r-1")) is None


def test_the_same_head_and_a_record_without_one_are_as_before(head_now, monkeypatch):
    head_now["miles-ray-q4-r-1"] = _running(OLD["node_id"])
    monkeypatch.setattr(ray_job, "serving_pod", lambda url: {"pod": OLD["pod"], "pod_uid": OLD["pod_uid"]})
    monkeypatch.setattr(ray_jobs, "head_node", lambda url, timeout=5: {"node_id": OLD["node_id"], "alive": [OLD["node_id"]]})
    state.save_record(_record())
    assert RayJob(state.load_record("r-1"), url=URL).state().status == "RUNNING"
    old = {k: v for k, v in _record().items() if k not in ("head", "attempts")}
    assert RayJob(old, url=URL).state().status == "RUNNING"
    assert RayJob(old, url=URL).state().to_json().get("head_lost") is None


def test_another_head_pod_is_enough_when_rays_state_api_does_not_answer_yet(head_now, monkeypatch):
    """The job's driver ran in the head pod that is gone: lost, without waiting for the new head's node list."""
    from miles_ray.core.errors import Unreachable

    def not_yet(url, timeout=5):
        raise Unreachable("state API not up yet")

    monkeypatch.setattr(ray_jobs, "head_node", not_yet)
    head_now["miles-ray-q4-r-1"] = _running(OLD["node_id"])
    state.save_record(_record())
    st = RayJob(state.load_record("r-1"), url=URL).state()
    assert st.status == "FAILED" and "the head now is head pod ml/q4-head-y (uid uid-new" in st.message


@pytest.mark.parametrize("head_now_is, started, want", [
    # the head pod is the same, Ray's head node id is not known from the submit: only the start times tell
    ({"node_id": NEW["node_id"], "start_time_ms": 5_000}, 1_000, "FAILED"),  # the job is older than the head
    ({"node_id": NEW["node_id"], "start_time_ms": 5_000}, 6_000, "RUNNING"),  # it started on this head
    ({"node_id": None, "start_time_ms": None}, 1_000, "RUNNING"),  # no head ALIVE yet: not known, not lost
])
def test_the_unsupervised_path_judges_a_lost_job_by_the_supervisors_rule(head_now, monkeypatch, head_now_is, started,
                                                                          want):
    """The run's own verbs (no supervisor) use the run controller's head-loss rule (rules.lost_with_head): the same
    verdicts as the supervisor's, the job's start against the head's included."""
    unknown = {**OLD, "node_id": None}
    monkeypatch.setattr(ray_job, "serving_pod", lambda url: {"pod": OLD["pod"], "pod_uid": OLD["pod_uid"]})
    monkeypatch.setattr(ray_jobs, "head_node", lambda url, timeout=5: {**head_now_is, "alive": ["w" * 56]})
    head_now["miles-ray-q4-r-1"] = {**_running(OLD["node_id"]), "start_time": started}
    state.save_record(_record(head=unknown))
    st = RayJob(state.load_record("r-1"), url=URL).state()
    assert st.status == want, st
    if want == "FAILED":
        assert "the job started before the head now serving" in st.message
