"""Races between real miles-ray processes on the same cluster, run, or local state.

| race | where proven |
|---|---|
| two `up --via kuberay` of one name | test_two_kube_ups_of_one_name (here) |
| two `scale` at once (CLI processes) | test_two_scales_at_once_end_consistent (here); adapter threads in tests/e2e/test_kube_cli.py::test_concurrent_scales_end_consistent |
| two `submit` of one run | test_two_submits_of_one_run_make_one_job (here) |
| two `up --backend local` of one name | test_two_local_ups_of_one_name_make_one_cluster (here) |
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import IMAGE
from tests.reliability.conftest import child_env, cli_proc

RAY = "2.60.0"


def _rcs(custom_objects, namespace):
    return custom_objects.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")["items"]


def _both(procs, timeout=240):
    return [(p.wait(timeout=timeout), *p.communicate()) for p in procs]


@pytest.mark.e2e
def test_two_kube_ups_of_one_name(kube_env, custom_objects, namespace, shared_volume, tmp_path, ledger):
    env = child_env(KUBECONFIG=str(kube_env.kubeconfig), MILES_RAY_STATE_DIR=str(tmp_path / "state"))
    args = ["up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY, "--no-ray-check",
            "--timeout", "150", "--namespace", namespace, "--name", "race"]
    ledger.record("race", "two up --via kuberay")
    results = _both([cli_proc(args, env, tmp_path) for _ in range(2)])
    for code, out, err in results:
        assert code == 0 and "Traceback" not in err, err
    said = sorted("already existed" if "cluster race already existed" in out else
                  "created" if "cluster race created" in out else out for _, out, _ in results)
    assert said == ["already existed", "created"]  # one made it, the other found it and waited for it
    loser_err = next(err for _, out, err in results if "already existed" in out)
    assert "already exists" in loser_err  # its progress says so (with this spec / made by a concurrent up)
    assert [r["metadata"]["name"] for r in _rcs(custom_objects, namespace)] == ["race"]


@pytest.mark.e2e
def test_two_scales_at_once_end_consistent(kube_env, cli, core_v1, custom_objects, namespace, shared_volume, tmp_path,
                                           wait_for, ledger):
    code, _, err = cli("up", "--via", "kuberay", "--nodes", "2", "--image", IMAGE, "--ray-version", RAY,
                       "--no-ray-check", "--timeout", "120", "--namespace", namespace, "--name", "scalerace")
    assert code == 0, err
    env = child_env(KUBECONFIG=str(kube_env.kubeconfig), MILES_RAY_STATE_DIR=str(tmp_path / "state"))
    event = ledger.record("race", "two scale at once")
    procs = [cli_proc(["scale", "--nodes", str(n), "--no-wait", "--force", "--backend", "kubernetes", "--namespace",
                       namespace, "--name", "scalerace", "-o", "json"], env, tmp_path) for n in (4, 1)]
    results = _both(procs)
    for code, out, err in results:
        assert code == 0 and "Traceback" not in err, err
    [rc] = _rcs(custom_objects, namespace)
    g = rc["spec"]["workerGroupSpecs"][0]
    event["final"] = g["replicas"]
    assert g["replicas"] in (1, 4) and g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g

    def converged():
        pods = core_v1.list_namespaced_pod(namespace, label_selector="ray.io/cluster=scalerace,ray.io/node-type=worker")
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
        return len(live) == g["replicas"]

    wait_for(f"{g['replicas']} running workers", converged, timeout=90)


@pytest.mark.ray
def test_two_submits_of_one_run_make_one_job(local_ray, tmp_path, ledger):
    from ray.job_submission import JobSubmissionClient

    env = child_env(MILES_RAY_STATE_DIR=str(tmp_path / "state"))
    args = ["submit", "--run", "race-run", "--nodes", "2", "--rehearse", "--address", local_ray.address, "--no-follow",
            "-o", "json"]
    ledger.record("race", "two submit of one run")
    results = _both([cli_proc(args, env, tmp_path) for _ in range(2)])
    for code, out, err in results:
        assert code == 0 and "Traceback" not in err, err
    ids = {json.loads(out)["submission_id"] for _, out, _ in results}
    assert ids == {"miles-ray-miles-race-run"}
    n = sum(1 for j in JobSubmissionClient(local_ray.address, headers=local_ray.headers()).list_jobs()
            if j.submission_id == "miles-ray-miles-race-run")
    assert n == 1
    assert sorted(json.loads(out)["created"] for _, out, _ in results) == [False, True]
    assert [p.name for p in (tmp_path / "state" / "runs").glob("*.json")] == ["race-run.json"]
    stop = cli_proc(["stop", "race-run"], env, tmp_path)  # its 2-node rehearsal would go on beside the next tests
    _, err = stop.communicate(timeout=120)
    assert stop.returncode == 0, err


@pytest.mark.ray
def test_two_local_ups_of_one_name_make_one_cluster(tmp_path, ledger):
    """Both processes take the local cluster's file lock in turn: one starts it, the other finds it running."""
    from miles_ray.adapters import local_ray as lr

    state = tmp_path / "state"
    env = child_env(MILES_RAY_STATE_DIR=str(state))
    args = ["up", "--backend", "local", "--nodes", "1", "-G", "1", "--name", "lockrace", "--timeout", "200", "-o", "json"]
    ledger.record("race", "two up --backend local")
    try:
        results = _both([cli_proc(args, env, tmp_path) for _ in range(2)], timeout=300)
        for code, out, err in results:
            assert code == 0 and "Traceback" not in err, err
        already = sorted(bool(json.loads(out).get("already_running")) for _, out, _ in results)
        st = lr.read_state(state / "local", "lockrace")
        heads = [st["head"]]
        assert already == [False, True]
        assert len(heads) == 1 and len(st["workers"]) == 1
        dashboards = {json.loads(out)["dashboard_url"] for _, out, _ in results}
        assert len(dashboards) == 1
    finally:
        if lr.state_path(state / "local", "lockrace").exists():
            lr.down(state / "local", "lockrace")
