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


def test_kueue_crd_copy_is_the_recorded_file() -> None:
    """tests/data/kueue holds Kueue's LocalQueue CRD unchanged (sha256 recorded in SOURCE with its module)."""
    import hashlib

    from tests.conftest import REPO

    data = REPO / "tests" / "data" / "kueue"
    source = dict(line.split("=", 1) for line in (data / "SOURCE").read_text().splitlines()
                  if line and not line.startswith("#"))
    crd_bytes = (data / "kueue.x-k8s.io_localqueues.yaml").read_bytes()
    assert hashlib.sha256(crd_bytes).hexdigest() == source["SHA256"]
    crd = yaml.safe_load(crd_bytes)
    assert crd["metadata"]["name"] == "localqueues.kueue.x-k8s.io" and source["MODULE"] == "sigs.k8s.io/kueue"
    assert {v["name"] for v in crd["spec"]["versions"] if v["served"]} >= {"v1beta2"}
