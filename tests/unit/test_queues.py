"""What --queue and --scheduler add to the rendered RayCluster and Polyaxon operation (validated by KubeRay's CRD
schema and Polyaxon's own schema and converter)."""

from __future__ import annotations

import yaml

from miles_ray.adapters.polyaxon_spec import to_custom_resource, validate_operation
from miles_ray.core.queues import apply_to_operation, apply_to_raycluster
from tests.conftest import IMAGE
from tests.unit.test_builders import RAY, _docs, kuberay_crd_validator

RENDER = ["render", "--image", IMAGE, "--ray-version", RAY, "--nodes", "2"]


def _queued(**extra):
    cfg, plan, rc, op = _docs("Qwen3-4B", 2, 8, **extra)
    return apply_to_raycluster(rc, cfg), apply_to_operation(op, cfg, plan.ray.gpu_workers)


def _pod_labels(rc: dict) -> list[dict]:
    return [rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"],
            *(g["template"]["metadata"]["labels"] for g in rc["spec"]["workerGroupSpecs"])]


def test_kueue_queue_labels_the_raycluster_only() -> None:
    rc, op = _queued(queue="team-a")
    assert not list(kuberay_crd_validator().iter_errors(rc))
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "suspend" not in rc["spec"] and rc["spec"]["enableInTreeAutoscaling"] is False
    assert all("kueue.x-k8s.io/queue-name" not in labels for labels in _pod_labels(rc))
    # Polyaxon path: the pods form one Kueue pod group (head + 2 workers)
    validate_operation(op)
    run = op["component"]["run"]
    for rep in (run["head"], run["workers"]["gpu"]):
        env = rep["environment"]
        assert env["labels"] == {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/pod-group-name": "miles-test"}
        assert env["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "3"}
    assert run["workers"]["gpu"]["environment"]["tolerations"]  # the GPU placement is kept
    cr = to_custom_resource(op, namespace="default", run_uuid="c" * 32, run_name="miles-test", project="miles")
    spec = cr["rayClusterSpec"]
    for group in (spec["head"], *spec["workers"]):
        assert group["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert group["template"]["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"


def test_volcano_scheduler_and_queue() -> None:
    rc, op = _queued(queue="gpu-q", scheduler="volcano")
    assert not list(kuberay_crd_validator().iter_errors(rc))
    labels = rc["metadata"]["labels"]
    assert labels["ray.io/scheduler-name"] == "volcano" and labels["volcano.sh/queue-name"] == "gpu-q"
    assert "kueue.x-k8s.io/queue-name" not in labels
    validate_operation(op)
    for rep in (op["component"]["run"]["head"], op["component"]["run"]["workers"]["gpu"]):
        assert rep["environment"]["schedulerName"] == "volcano"
        assert rep["environment"]["annotations"] == {"scheduling.volcano.sh/queue-name": "gpu-q"}
    rc, _ = _queued(scheduler="volcano")  # Volcano's default queue
    assert rc["metadata"]["labels"]["ray.io/scheduler-name"] == "volcano" and "volcano.sh/queue-name" not in rc[
        "metadata"]["labels"]


def test_no_queue_changes_nothing() -> None:
    cfg, plan, rc, op = _docs("Qwen3-4B", 2, 8)
    assert apply_to_raycluster(rc, cfg) == rc and apply_to_operation(op, cfg, 2) == op


def test_render_cli_options(cli, clean_env) -> None:
    code, out, err = cli(*RENDER, "-F", "kuberay", "--queue", "team-a", "-o", "json")
    assert code == 0, err
    assert yaml.safe_load(out)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    code, out, err = cli(*RENDER, "-F", "polyaxon", "--scheduler", "volcano", "-o", "json")
    assert code == 0, err
    assert yaml.safe_load(out)["component"]["run"]["head"]["environment"]["schedulerName"] == "volcano"
    code, out, err = cli(*RENDER, "--scheduler", "slurm")
    assert code == 2 and out == "" and err.startswith("error: --scheduler") and "volcano" in err
    code, out, err = cli(*RENDER, "--queue", "Team_A")
    assert code == 2 and out == "" and "DNS-1123" in err


def test_kueue_queued_is_a_labelled_suspended_raycluster() -> None:
    from miles_ray.core.queues import kueue_queue_of, kueue_queued

    rc = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "spec": {"suspend": True}}
    assert kueue_queue_of(rc) == "team-a" and kueue_queued(rc)
    assert not kueue_queued({**rc, "spec": {"suspend": False}})  # admitted
    assert not kueue_queued({"metadata": {"labels": {}}, "spec": {"suspend": True}})  # parked, no queue
    assert kueue_queue_of(None) is None and not kueue_queued(None)


def test_kueue_pending_reason_quotes_kueue() -> None:
    from miles_ray.core.queues import kueue_pending_reason

    assert "no Kueue Workload" in kueue_pending_reason(None)
    pending = {"metadata": {"name": "raycluster-b-1f2e3"}, "spec": {"active": True}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in "
                    "flavor gpu, 2 more needed"}]}}
    assert kueue_pending_reason(pending) == ("Workload raycluster-b-1f2e3: couldn't assign flavors to pod set "
                                             "workers: insufficient unused quota for nvidia.com/gpu in flavor gpu, "
                                             "2 more needed")
    assert "deactivated" in kueue_pending_reason({**pending, "spec": {"active": False}})
    admitted = {"metadata": {"name": "w"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "message": "Quota reserved in ClusterQueue gpus"},
        {"type": "Admitted", "status": "True", "message": "The workload is admitted"}]}}
    assert kueue_pending_reason(admitted) == "Workload w is admitted; Kueue is unsuspending the RayCluster"
    assert kueue_pending_reason({"metadata": {"name": "w"}}) == "Workload w is pending"
