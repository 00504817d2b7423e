"""The run backends behind one seam (miles_ray.services.runs): which backend serves a run record, and the typed
results of the run verbs, whose -o json keys (and their order) are what the dicts they replace had."""

from __future__ import annotations

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.errors import ConfigError
from miles_ray.core.runs import JobInfo, RunStatus, SavedCopySource, Stopped
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
from miles_ray.services.runs import backend_for, pick_run, run_namespace
from miles_ray.services.runs.polyaxon_job import PolyaxonJob
from miles_ray.services.runs.ray_job import RayJob
from tests.conftest import IMAGE

REC = {"run": "r-1", "submission_id": "miles-ray-q4-r-1", "address": "k8s://ml/q4", "output_dir": "/mnt/miles/runs/r-1",
       "recipe": "Qwen3-4B", "mode": "direct"}
INFO = {"job_id": "miles-ray-q4-r-1", "ray_job_id": "02000000", "status": "RUNNING", "message": None,
        "entrypoint": "python3 train.py", "metadata": {"miles_ray_run": "r-1"}, "start_time": 1, "end_time": None,
        "driver_exit_code": None, "runtime_env": {"env_vars": {}}}


@pytest.mark.parametrize("mode, address, backend", [
    ("launcher", "k8s://ml/q4", PolyaxonJob),
    ("launcher", "http://q4-head-svc.ml.svc:8265", PolyaxonJob),  # a head on Kubernetes by its service URL
    ("launcher", "local://q4", RayJob),  # the launcher run here
    ("launcher", "http://127.0.0.1:8265", RayJob),
    ("direct", "k8s://ml/q4", RayJob),
    ("rehearse", "local://q4", RayJob),
])
def test_one_dispatch_decides_the_backend_of_a_record(mode, address, backend):
    assert type(backend_for({**REC, "mode": mode, "address": address})) is backend


def test_the_dispatch_agrees_with_the_kind_of_job_submit_prepares():
    cfg = load_config({"name": "q4", "namespace": "ml", "nodes": 2, "image": IMAGE}, environ={})
    for address in ("k8s://ml/q4", "local://q4", "http://10.0.0.5:8265"):
        valid = validate_request(cfg, SubmitRequest(run="l-1", mode="launcher"))
        job = prepare_submit(cfg, valid, SubmitTarget("kuberay", address), created="t", launchers_dir="/unused")
        assert (job.kind == "launcher-polyaxon") is isinstance(backend_for(job.record), PolyaxonJob)


def test_a_prepared_record_leaves_the_polyaxon_host_to_creation():
    """The dry run prints the prepared record: its keys stay what they were; the host is kept once the job is
    created on it."""
    cfg = load_config({"name": "q4", "namespace": "ml", "nodes": 2, "image": IMAGE}, environ={})
    valid = validate_request(cfg, SubmitRequest(run="l-1", mode="launcher"))
    job = prepare_submit(cfg, valid, SubmitTarget("kuberay", "k8s://ml/q4"), created="t", launchers_dir="/unused")
    assert "polyaxon_host" not in job.record and job.record["polyaxon_project"] is None


def test_run_status_json_is_the_old_dict():
    live = RunStatus.of_job(REC, JobInfo.of(INFO)).to_json()
    info = {k: v for k, v in INFO.items() if k != "runtime_env"}
    old = {"run": "r-1", "submission_id": REC["submission_id"], "address": REC["address"], **info,
           "output_dir": REC["output_dir"], "recipe": REC["recipe"], "mode": "direct"}
    assert list(live.items()) == list(old.items())

    saved = JobInfo.of({**info, "submission_id": REC["submission_id"], "status": "STOPPED"})
    saved.saved_copy = SavedCopySource(dir="/s", saved_at="t", reason="down")
    got = RunStatus.of_job(REC, saved).to_json()
    old = {"run": "r-1", "submission_id": REC["submission_id"], "address": REC["address"], **info, "status": "STOPPED",
           "saved_copy": {"dir": "/s", "saved_at": "t", "reason": "down"}, "output_dir": REC["output_dir"],
           "recipe": REC["recipe"], "mode": "direct"}
    assert list(got.items()) == list(old.items())

    px = RunStatus(run="r-1", submission_id="polyaxon:u", address="k8s://ml/q4", status="PENDING",
                   polyaxon_status="queued", polyaxon_uuid="u", message=None, output_dir="/o", recipe="R",
                   mode="launcher").to_json()
    assert list(px) == ["run", "submission_id", "address", "status", "polyaxon_status", "polyaxon_uuid", "message",
                        "output_dir", "recipe", "mode"]
    assert Stopped(run="r-1", submission_id="s", stopped=True, status=None).to_json() == {
        "run": "r-1", "submission_id": "s", "stopped": True, "status": None}


def test_a_launcher_record_without_its_host_says_what_to_do(monkeypatch):
    """A record from before the host was kept: POLYAXON_HOST as before; without it, an error naming what the
    user can do (status/logs/stop have no --polyaxon-host)."""
    monkeypatch.delenv("POLYAXON_HOST", raising=False)
    rec = {**REC, "mode": "launcher", "polyaxon_run_uuid": "u", "polyaxon_project": "p"}
    backend = backend_for(rec)
    with pytest.raises(ConfigError) as e:
        backend.state()
    assert "POLYAXON_HOST" in e.value.hint and "--polyaxon-host" not in str(e.value) + e.value.hint
    assert backend.live_state() == "UNREACHABLE"


def test_pick_run_and_its_namespace(monkeypatch, tmp_path):
    from miles_ray.adapters import state

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="no runs yet"):
        pick_run(None)
    state.save_record({**REC, "run": "a", "address": "k8s://ml/q4"})
    state.save_record({**REC, "run": "b", "address": "local://q4"})
    assert run_namespace(state.load_record("a")) == "ml" and run_namespace(state.load_record("b")) is None
    assert pick_run("a", "ml") == "a" and pick_run(None, "ml") == "a"
    with pytest.raises(ConfigError, match="not a Kubernetes run"):
        pick_run("b", "ml")
