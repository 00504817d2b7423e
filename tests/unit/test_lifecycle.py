"""Pure parts of the lifecycle verbs: who owns the replicas (KubeRay's autoscaler), idle reports, durations."""

from __future__ import annotations

import pytest

from miles_ray.services.lifecycle import autoscaler_owner
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
