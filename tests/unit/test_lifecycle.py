"""Pure parts of the lifecycle verbs: who owns the replicas (KubeRay's autoscaler), idle reports, durations."""

from __future__ import annotations

import pytest

from miles_ray.services.backends.idle import judge_idle
from miles_ray.services.backends.kube.scaling import autoscaler_owner
from tests.unit.test_builders import CASES, _docs


@pytest.mark.parametrize("name,n,g", CASES)
def test_rendered_clusters_never_enable_the_autoscaler(name: str, n: int, g: int) -> None:
    """RL runs need a fixed gang of GPU workers: what 'render'/'up' make never turns KubeRay's autoscaler on."""
    _, _, rc, op = _docs(name, n, g)
    assert rc["spec"]["enableInTreeAutoscaling"] is False and autoscaler_owner(rc) is None
    assert not op["component"]["run"].get("enableInTreeAutoscaling")
    [group] = rc["spec"]["workerGroupSpecs"]
    assert group["minReplicas"] == group["replicas"] == group["maxReplicas"]


def test_polyaxon_custom_resource_has_no_autoscaler() -> None:
    from miles_ray.adapters.polyaxon_spec import to_custom_resource

    _, _, _, op = _docs("Qwen3-4B", 2, 8)
    cr = to_custom_resource(op, namespace="default", run_uuid="b" * 32, run_name="miles-test", project="miles")
    assert not cr["rayClusterSpec"].get("enableInTreeAutoscaling")


def test_autoscaler_owner() -> None:
    assert autoscaler_owner({"spec": {"enableInTreeAutoscaling": True}}).startswith("KubeRay's in-tree autoscaler")
    assert autoscaler_owner({"spec": {"enableInTreeAutoscaling": False}}) is None
    assert autoscaler_owner({"spec": {}}) is None


# -- judge_idle: what Ray answered (activity API + job list, as the adapters return them) -> idle or not ----------

T0 = 1_800_000_000.0  # seconds since the epoch


def _act(status: str, reason: str | None = None, last: float | None = None) -> dict:
    return {"status": status, "reason": reason, "observed_at": T0 + 100, "last_activity_at": last,
            "head_started_at": T0}


def _job(jid: str, status: str, end: float | None = None) -> dict:
    return {"job_id": jid, "status": status, "end_time": int(end * 1000) if end else None}


def test_idle_since_the_head_started_when_nothing_ever_ran() -> None:
    r = judge_idle(_act("INACTIVE"), [])
    assert r.idle is True and r.idle_seconds == 100.0 and r.last_job_end is None
    assert r.reason == "no job pending or running; none has run since the head started"


def test_a_running_job_or_a_running_plain_driver_is_busy() -> None:
    r = judge_idle(_act("ACTIVE", "Number of active drivers: 1"), [_job("busy", "RUNNING")])
    assert r.to_json() == {"idle": False, "busy_jobs": ["busy"],
                 "reason": "Number of active drivers: 1, job(s) pending or running: busy"}
    # a driver that is no job's (python + ray.init on the head) is listed as a RUNNING job of its own
    r = judge_idle(_act("INACTIVE"), [_job("02000000", "RUNNING"), _job("old", "SUCCEEDED", T0 + 10)])
    assert r.idle is False and r.busy_jobs == ["02000000"]


def test_drivers_counted_active_after_every_job_ended_are_not_activity() -> None:
    r = judge_idle(_act("ACTIVE", "Number of active drivers: 1", last=T0 + 40), [_job("busy", "STOPPED", T0 + 40)])
    assert r.idle is True and r.idle_seconds == 60.0
    assert r.reason.endswith("; Ray still counts driver(s) of ended jobs as active (Number of active drivers: 1)")


def test_a_failed_activity_api_leaves_the_job_list_to_decide() -> None:
    err = _act("ERROR", "TimeoutError()")
    r = judge_idle(err, [_job("a", "SUCCEEDED", T0 + 70)])
    assert r.idle is True and r.idle_seconds == 30.0 and "activity API failed (TimeoutError())" in r.reason
    assert judge_idle(err, [_job("a", "PENDING")]).idle is False


def test_no_job_and_no_head_start_cannot_be_told() -> None:
    r = judge_idle({"status": "INACTIVE", "observed_at": T0}, [])
    assert r.to_json() == {"idle": None, "reason": "Ray reports no job and no head start time"}
