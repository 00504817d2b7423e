"""Builders: head and workers from one container spec; every document valid for its consumer."""

from __future__ import annotations

import copy
import functools
import json

import pytest
import yaml

from miles_ray.core.builders import build_operation, build_raycluster, head_and_worker_containers
from miles_ray.core.config import load_config
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from tests.conftest import IMAGE, SHARED

RAY = "2.60.0"
CASES = [(name, n, g) for name in BUILTIN for n in (1, 2, 4, 8, 16) for g in (8, 4)
         if plan_split(BUILTIN[name], n, g).feasible]


def _docs(name: str, n: int, g: int, **extra):
    cfg = load_config({"recipe": name, "nodes": n, "gpus_per_node": g, "name": "miles-test", **extra}, environ={})
    plan = plan_split(BUILTIN[name], n, g)
    return cfg, plan, build_raycluster(cfg, plan, IMAGE, RAY), build_operation(cfg, plan, IMAGE, RAY)


@functools.lru_cache(maxsize=1)
def shared_crd_validator():
    """The CRD as shipped by KubeRay (test data in shared/), independent of the copy in the package."""
    from openapi_schema_validator import OAS30Validator

    from miles_ray.adapters.crd_schema import _strict

    crd = yaml.safe_load((SHARED / "schemas/kuberay/ray.io_rayclusters.yaml").read_text())
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return OAS30Validator(schema)


def test_packaged_schema_is_the_shared_one() -> None:
    from importlib import resources

    packaged = json.loads(resources.files("miles_ray.schemas").joinpath("raycluster_v1.json").read_text())
    assert packaged == json.loads((SHARED / "schemas/kuberay/raycluster_v1_openapi_schema.json").read_text())


@pytest.mark.parametrize("name,n,g", CASES)
def test_raycluster_valid_and_aligned(name: str, n: int, g: int) -> None:
    cfg, plan, rc, _ = _docs(name, n, g)
    errors = list(shared_crd_validator().iter_errors(rc))
    assert not errors, errors[0].message
    spec = rc["spec"]
    assert spec["rayVersion"] == RAY
    [group] = spec["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == n
    head_c, worker_c = head_and_worker_containers(rc)
    # specs differ only in resources
    assert {k: v for k, v in head_c.items() if k != "resources"} == {k: v for k, v in worker_c.items() if k != "resources"}
    assert head_c["image"] == worker_c["image"] == IMAGE
    res = worker_c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == str(g)
    assert "nvidia.com/gpu" not in head_c["resources"]["requests"] and "nvidia.com/gpu" not in head_c["resources"]["limits"]
    assert group["rayStartParams"]["num-gpus"] == str(g)
    assert int(group["rayStartParams"]["num-cpus"]) >= g + 1
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    env = {e["name"]: e["value"] for e in worker_c["env"]}
    assert env["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and env["PROMETHEUS_PORT"] == "9090"
    assert env["NCCL_NVLS_ENABLE"] in {"0", "1"}
    head_pod = spec["headGroupSpec"]["template"]["spec"]
    worker_pod = group["template"]["spec"]
    assert head_pod["volumes"] == worker_pod["volumes"]
    assert worker_c["volumeMounts"] == [{"name": "miles-data", "mountPath": "/mnt/miles"},
                                        {"name": "shm", "mountPath": "/dev/shm"}]
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in worker_pod["volumes"]
    assert worker_pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert json.loads(rc["metadata"]["annotations"]["miles-ray/plan"])["miles_args"] == plan.miles_args


def test_pod_templates_are_valid_pods() -> None:
    import kubernetes_validate

    _, _, rc, _ = _docs("Qwen3-4B", 4, 8, node_selector={"nvidia.com/gpu.present": "true"})
    for tpl in (rc["spec"]["headGroupSpec"]["template"], rc["spec"]["workerGroupSpecs"][0]["template"]):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **tpl.get("metadata", {})}, "spec": tpl["spec"]}
        kubernetes_validate.validate(pod, "1.30", strict=True)


def test_schema_rejects_a_broken_raycluster() -> None:
    from miles_ray.adapters.crd_schema import validate_raycluster
    from miles_ray.core.errors import SpecError

    _, _, rc, _ = _docs("Qwen3-4B", 2, 8)
    validate_raycluster(rc)
    bad = copy.deepcopy(rc)
    bad["spec"]["workerGroupSpecs"][0]["replicas"] = "four"
    with pytest.raises(SpecError, match="replicas"):
        validate_raycluster(bad)
    assert list(shared_crd_validator().iter_errors(bad))


@pytest.mark.parametrize("name,n,g", [c for c in CASES if c[2] == 8])
def test_polyaxon_operation_valid_and_aligned(name: str, n: int, g: int) -> None:
    from miles_ray.adapters.polyaxon_spec import validate_operation

    _, _, _, op = _docs(name, n, g)
    validate_operation(op)
    run = op["component"]["run"]
    assert run["kind"] == "raycluster" and run["rayVersion"] == RAY
    assert op["component"]["plugins"] == {"shm": True}
    head_c, worker_c = head_and_worker_containers(op)
    assert {k: v for k, v in head_c.items() if k != "resources"} == {k: v for k, v in worker_c.items() if k != "resources"}
    worker = run["workers"]["gpu"]
    assert worker["replicas"] == n and worker["rayStartParams"]["num-gpus"] == str(g)
    assert run["head"]["rayStartParams"]["num-gpus"] == "0"
    assert run["head"]["connections"] == worker["connections"] == ["miles-data"]


def test_polyaxon_custom_resource_keeps_head_and_workers_aligned() -> None:
    """What Polyaxon's own converter makes of the operation: head and worker pods still share the image,
    the data mount, /dev/shm and the Miles environment; the name Polyaxon gives the cluster fits KubeRay."""
    from miles_ray.adapters.polyaxon_spec import invalid_volume_names, to_custom_resource
    from miles_ray.core.names import RAYCLUSTER_NAME_MAX

    _, _, _, op = _docs("Qwen3-4B", 4, 8)
    cr = to_custom_resource(op, namespace="default", run_uuid="a" * 32, run_name="miles-test", project="miles")
    assert (cr["apiVersion"], cr["kind"]) == ("polyaxon.com/v1", "Cluster")
    assert len(cr["metadata"]["name"]) <= RAYCLUSTER_NAME_MAX
    assert not invalid_volume_names(cr)
    spec = cr["rayClusterSpec"]
    assert spec["rayVersion"] == RAY
    [worker] = spec["workers"]
    assert worker["replicas"] == 4 and worker["groupName"] == "gpu"
    mains = [g["template"]["spec"]["containers"][0] for g in (spec["head"], worker)]
    for c in mains:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert c["image"] == IMAGE
        assert env["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and env["PROMETHEUS_PORT"] == "9090"
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/mnt/miles"] == "miles-data" and "/dev/shm" in mounts
    assert mains[1]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in mains[0]["resources"]["limits"]
