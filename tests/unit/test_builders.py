"""Builders: head and workers from one container spec; every document valid for its consumer."""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from miles_ray.core.builders import build_operation, build_raycluster
from tests.infra.documents import head_and_worker_containers
from miles_ray.core.config import load_config
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from tests.conftest import IMAGE, REPO

RAY = "2.60.0"
CASES = [(name, n, g) for name in BUILTIN for n in (1, 2, 4, 8, 16) for g in (8, 4)
         if plan_split(BUILTIN[name], n, g).feasible]
CRD_DIR = REPO / "tests" / "data" / "kuberay"
CRD_FILE = CRD_DIR / "ray.io_rayclusters.yaml"


def _docs(name: str, n: int, g: int, **extra):
    cfg = load_config({"recipe": name, "nodes": n, "gpus_per_node": g, "name": "miles-test", **extra}, environ={})
    plan = plan_split(BUILTIN[name], n, g)
    return cfg, plan, build_raycluster(cfg, plan, IMAGE, RAY), build_operation(cfg, plan, IMAGE, RAY)


def _key_values(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a file (comments and blank lines skipped)."""
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


SOURCE = _key_values(CRD_DIR / "SOURCE")


@functools.lru_cache(maxsize=1)
def kuberay_crd() -> dict:
    """The RayCluster CRD as shipped by KubeRay (tests/data/kuberay), after checking its recorded sha256;
    independent of the schema copy in the package."""
    raw = CRD_FILE.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SOURCE["SHA256"], f"{CRD_FILE} differs from the recorded sha256"
    return yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml when there: 10x faster


def kuberay_v1_schema() -> dict:
    [v1] = [v for v in kuberay_crd()["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=1)
def kuberay_crd_validator():
    from openapi_schema_validator import OAS30Validator

    from miles_ray.adapters.crd_schema import _strict

    schema = _strict(kuberay_v1_schema())
    schema["properties"]["metadata"] = {"type": "object"}
    return OAS30Validator(schema)


def test_crd_copy_is_the_recorded_kuberay_release() -> None:
    """The copy is the file KubeRay ships at the version the fake-GPU control plane runs."""
    versions = _key_values(REPO / "cluster" / "versions.env")
    assert SOURCE["MODULE"] == "github.com/ray-project/kuberay/ray-operator"
    assert SOURCE["VERSION"] == versions["KUBERAY_VERSION"], "refresh tests/data/kuberay (see its SOURCE)"
    assert SOURCE["PATH_IN_MODULE"] == "config/crd/bases/ray.io_rayclusters.yaml"
    crd = kuberay_crd()  # checks the sha256
    assert crd["kind"] == "CustomResourceDefinition" and crd["metadata"]["name"] == "rayclusters.ray.io"
    assert [v["name"] for v in crd["spec"]["versions"] if v.get("storage")] == ["v1"]


def _go_module_cache() -> Path | None:
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    go = shutil.which("go")
    if go:
        proc = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip():
            return Path(proc.stdout.strip())
    default = Path.home() / "go" / "pkg" / "mod"
    return default if default.is_dir() else None


def _module_h1(zip_path: Path) -> str:
    """The Go checksum (go.sum "h1:") of a module zip: dirhash Hash1 over its files."""
    with zipfile.ZipFile(zip_path) as z:
        summary = "".join(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n" for n in sorted(z.namelist()))
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def test_crd_copy_equals_the_file_in_the_module_zip() -> None:
    """When the Go module cache holds KubeRay's module zip (cluster/build.sh downloads it), the zip has the
    recorded Go checksum and the copy is byte for byte the file inside it."""
    cache = _go_module_cache()
    escaped = "".join(f"!{c.lower()}" if c.isupper() else c for c in SOURCE["MODULE"])
    zip_path = cache / "cache" / "download" / escaped / "@v" / f"{SOURCE['VERSION']}.zip" if cache else None
    if zip_path is None or not zip_path.is_file():
        pytest.skip(f"{SOURCE['MODULE']}@{SOURCE['VERSION']} is not in the Go module cache ({zip_path})")
    assert _module_h1(zip_path) == SOURCE["MODULE_SUM"]
    with zipfile.ZipFile(zip_path) as z:
        inside = z.read(f"{SOURCE['MODULE']}@{SOURCE['VERSION']}/{SOURCE['PATH_IN_MODULE']}")
    assert inside == CRD_FILE.read_bytes()


def test_packaged_schema_is_kuberays() -> None:
    """The schema `render` validates against is exactly the v1 OpenAPI schema of KubeRay's CRD."""
    from importlib import resources

    packaged = json.loads(resources.files("miles_ray.schemas").joinpath("raycluster_v1.json").read_text())
    expected = kuberay_v1_schema()
    assert packaged == expected, (f"miles_ray/schemas/raycluster_v1.json is not the v1 schema of KubeRay "
                                  f"{SOURCE['VERSION']}; differences: {_differences(packaged, expected)[:8]}")


def _differences(a, b, path: str = "") -> list[str]:
    """Paths where two JSON documents differ (for a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in (_differences(a[k], b[k], f"{path}/{k}") if k in a and k in b
                          else [f"{path}/{k} only in {'the package' if k in a else 'KubeRay'}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}/{i}")]
    return [] if a == b else [f"{path} differs"]


@pytest.mark.parametrize("name,n,g", CASES)
def test_raycluster_valid_and_aligned(name: str, n: int, g: int) -> None:
    cfg, plan, rc, _ = _docs(name, n, g)
    errors = list(kuberay_crd_validator().iter_errors(rc))
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
    assert list(kuberay_crd_validator().iter_errors(bad))


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


def test_cpu_request_lowers_only_the_kubernetes_request() -> None:
    """cpu_request_per_node changes the worker pods' CPU request and nothing else: the limit and Ray's
    num-cpus (what Miles' placement group counts) keep cpus_per_node, in both the RayCluster and the
    Polyaxon operation; the result is still a valid RayCluster and a valid pod."""
    import kubernetes_validate

    cfg, _, rc, op = _docs("Qwen3-4B", 2, 8, cpus_per_node=16, cpu_request_per_node="500m")
    assert not list(kuberay_crd_validator().iter_errors(rc))
    _, worker_c = head_and_worker_containers(rc)
    assert worker_c["resources"]["requests"]["cpu"] == "500m"
    assert worker_c["resources"]["limits"]["cpu"] == "16"
    assert rc["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-cpus"] == "16"
    tpl = rc["spec"]["workerGroupSpecs"][0]["template"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": tpl["spec"]},
                                 "1.30", strict=True)
    [worker] = op["component"]["run"]["workers"].values() if isinstance(op["component"]["run"]["workers"], dict) \
        else op["component"]["run"]["workers"]
    assert worker["container"]["resources"]["requests"]["cpu"] == "500m"
    assert worker["container"]["resources"]["limits"]["cpu"] == "16"
    _, _, rc_default, _ = _docs("Qwen3-4B", 2, 8, cpus_per_node=16)
    _, w_default = head_and_worker_containers(rc_default)
    assert w_default["resources"]["requests"]["cpu"] == w_default["resources"]["limits"]["cpu"] == "16"


def test_restricted_pod_security_on_head_and_workers() -> None:
    """pod_security: restricted gives the head and every worker what the restricted Pod Security Standard
    requires (non-root uid, no privilege escalation, all capabilities dropped, seccomp RuntimeDefault), in the
    RayCluster and in the Polyaxon operation alike; baseline adds nothing."""
    import kubernetes_validate

    from miles_ray.adapters.polyaxon_spec import validate_operation

    _, _, rc, op = _docs("Qwen3-4B", 2, 8, pod_security="restricted", run_as_user=1234)
    assert not list(kuberay_crd_validator().iter_errors(rc))
    want_c = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 1234, "seccompProfile": {"type": "RuntimeDefault"}}
    for tpl in (rc["spec"]["headGroupSpec"]["template"], rc["spec"]["workerGroupSpecs"][0]["template"]):
        spec = tpl["spec"]
        assert spec["containers"][0]["securityContext"] == want_c
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1234
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert all("hostPath" not in v for v in spec["volumes"])  # restricted allows PVC and emptyDir only here
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec},
                                     "1.30", strict=True)
    validate_operation(op)
    run = op["component"]["run"]
    workers = run["workers"] if isinstance(run["workers"], dict) else {w["name"]: w for w in run["workers"]}
    for role in (run["head"], *workers.values()):
        assert role["container"]["securityContext"] == want_c
    _, _, rc_base, _ = _docs("Qwen3-4B", 2, 8)
    for tpl in (rc_base["spec"]["headGroupSpec"]["template"], rc_base["spec"]["workerGroupSpecs"][0]["template"]):
        assert "securityContext" not in tpl["spec"] and "securityContext" not in tpl["spec"]["containers"][0]
