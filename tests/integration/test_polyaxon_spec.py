"""Polyaxon 2.18 specs, checked with Polyaxon's own code (no server needed)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles_ray.adapters import polyaxon_spec as ps
from miles_ray.core.errors import SpecError

REPO = Path(__file__).resolve().parents[2]
IMAGE = "radixark/miles@sha256:" + "3f" * 32
RUN_UUID = "0123456789abcdef0123456789abcdef"


def miles_operation() -> dict:
    """The operation shape the lead's builder produces."""
    return {
        "version": 1.1,
        "kind": "operation",
        "name": "miles-qwen3-4b",
        "tags": ["miles-ray"],
        "component": {
            "version": 1.1,
            "kind": "component",
            "name": "miles-qwen3-4b",
            "plugins": {"shm": True},
            "inputs": [{"name": "output_root", "type": "str", "isOptional": True, "value": "/mnt/miles/runs"}],
            "run": {
                "kind": "raycluster",
                "rayVersion": "2.60.0",
                "head": {
                    "rayStartParams": {"num-gpus": "0", "dashboard-host": "0.0.0.0"},
                    "connections": ["miles-data"],
                    "container": {
                        "name": "ray-head",
                        "image": IMAGE,
                        "env": [
                            {"name": "MILES_SCRIPT_EXTERNAL_RAY", "value": "1"},
                            {"name": "MILES_OUTPUT_DIR", "value": "/mnt/miles/runs/{{ globals.uuid }}"},
                        ],
                        "resources": {
                            "requests": {"cpu": "8", "memory": "64Gi"},
                            "limits": {"cpu": "8", "memory": "64Gi"},
                        },
                    },
                },
                "workers": {
                    "gpu": {
                        "replicas": 4,
                        "rayStartParams": {"num-gpus": "8"},
                        "connections": ["miles-data"],
                        "environment": {
                            "nodeSelector": {"nvidia.com/gpu.present": "true"},
                            "tolerations": [
                                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                            ],
                        },
                        "container": {
                            "name": "ray-worker",
                            "image": IMAGE,
                            # {{ globals.* }} is not resolvable in worker groups (Polyaxon 2.18 bug);
                            # a param ({{ name }}) is.
                            "env": [
                                {"name": "MILES_SCRIPT_EXTERNAL_RAY", "value": "1"},
                                {"name": "MILES_OUTPUT_DIR", "value": "{{ output_root }}/worker"},
                            ],
                            "resources": {
                                "requests": {"nvidia.com/gpu": "8", "cpu": "64"},
                                "limits": {"nvidia.com/gpu": "8", "cpu": "64"},
                            },
                        },
                    }
                },
            },
        },
    }


def _run(op: dict) -> dict:
    return op["component"]["run"]


# ------------------------------------------------------------------------------ validation


def test_module_import_does_not_import_polyaxon():
    code = (
        "import sys, miles_ray.adapters.polyaxon_spec, miles_ray.adapters.polyaxon_api;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('polyaxon','kubernetes','haupt')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_good_operation_is_valid():
    ps.validate_operation(miles_operation())


def test_component_alone_is_valid():
    ps.validate_operation(miles_operation()["component"])


def test_shape_answers_that_are_also_valid():
    op = miles_operation()
    # plugins may sit on the operation as well as on the component
    on_op = copy.deepcopy(op)
    on_op["plugins"] = on_op["component"].pop("plugins")
    ps.validate_operation(on_op)
    # the container name is optional (Polyaxon renames the main container anyway)
    no_name = copy.deepcopy(op)
    del _run(no_name)["head"]["container"]["name"]
    ps.validate_operation(no_name)


def _bad(mutate) -> dict:
    op = miles_operation()
    mutate(op)
    return op


BAD = {
    "kind rayjob": (lambda op: _run(op).update(kind="rayjob"), ["component.run.kind", "rayjob"]),
    "unknown run field": (lambda op: _run(op).update(bogus=1), ["bogus", "component.run"]),
    "unknown replica field": (
        lambda op: _run(op)["head"].update(foo=1), ["`foo`", "component.run.head"]
    ),
    "nodeSelector outside environment": (
        lambda op: _run(op)["workers"]["gpu"].update(nodeSelector={"a": "b"}),
        ["nodeSelector", "component.run.workers.gpu"],
    ),
    "workers as a list": (
        lambda op: _run(op).update(workers=[dict(_run(op)["workers"]["gpu"], name="gpu")]),
        ["component.run.workers", "dictionary"],
    ),
    "container typo": (
        lambda op: _run(op)["head"]["container"].update(imagee="x"),
        ["imagee", "component.run.head.container"],
    ),
    "replicas not a number": (
        lambda op: _run(op)["workers"]["gpu"].update(replicas="four"),
        ["component.run.workers.gpu.replicas"],
    ),
    "unknown operation section": (lambda op: op.update(foo=1), ["foo"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_operation_is_rejected_with_the_field_named(case):
    mutate, expected = BAD[case]
    with pytest.raises(SpecError) as info:
        ps.validate_operation(_bad(mutate))
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in expected:
        assert part in msg, msg
    assert info.value.exit_code == 2


def test_runtime_context_in_worker_group_is_rejected():
    op = miles_operation()
    _run(op)["workers"]["gpu"]["container"]["env"][1]["value"] = "/mnt/miles/runs/{{ globals.uuid }}"
    with pytest.raises(SpecError, match=r"component\.run\.workers\.gpu\.container\.env\[1\]\.value"):
        ps.validate_operation(op)
    with pytest.raises(SpecError, match="globals"):
        ps.to_custom_resource(op, "polyaxon", RUN_UUID, "m", "miles")


def test_not_a_mapping():
    with pytest.raises(SpecError):
        ps.validate_operation(["kind", "operation"])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ conversion


@pytest.fixture(scope="module")
def cr() -> dict:
    return ps.to_custom_resource(
        miles_operation(), namespace="polyaxon", run_uuid=RUN_UUID, run_name="miles-qwen3-4b",
        project="miles",
    )


def _groups(cr: dict) -> list[dict]:
    rcs = cr["rayClusterSpec"]
    return [rcs["head"], *rcs["workers"]]


def _main(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]


def test_converter_yields_polyaxon_cluster_resource(cr):
    assert cr["apiVersion"] == "polyaxon.com/v1"
    assert cr["kind"] == "Cluster"
    assert cr["metadata"]["name"] == f"plx-operation-{RUN_UUID}"
    assert cr["metadata"]["namespace"] == "polyaxon"
    assert json.loads(json.dumps(cr)) == cr  # plain JSON
    rcs = cr["rayClusterSpec"]
    assert rcs["rayVersion"] == "2.60.0"
    assert rcs["head"]["groupName"] == "head"
    assert [w["groupName"] for w in rcs["workers"]] == ["gpu"]
    assert rcs["workers"][0]["replicas"] == 4
    assert rcs["head"]["rayStartParams"] == {"num-gpus": "0", "dashboard-host": "0.0.0.0"}
    assert rcs["workers"][0]["rayStartParams"] == {"num-gpus": "8"}


def test_head_and_workers_carry_same_image_mounts_env(cr):
    images, mounts, envs = set(), [], []
    for g in _groups(cr):
        main = _main(g)
        assert main["name"] == "polyaxon-main"  # the Ray container is first, renamed by Polyaxon
        images.add(main["image"])
        mounts.append({(m["name"], m["mountPath"]) for m in main["volumeMounts"]})
        env = {e["name"]: e.get("value") for e in main["env"]}
        envs.append({k: env.get(k) for k in ("MILES_SCRIPT_EXTERNAL_RAY", "MILES_OUTPUT_DIR")})
        volumes = {v["name"]: v for v in g["template"]["spec"]["volumes"]}
        assert volumes["miles-data"]["persistentVolumeClaim"]["claimName"] == "miles-data"
        assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert images == {IMAGE}
    assert mounts[0] == mounts[1]
    assert ("miles-data", "/mnt/miles") in mounts[0] and ("shm", "/dev/shm") in mounts[0]
    assert envs[0]["MILES_SCRIPT_EXTERNAL_RAY"] == envs[1]["MILES_SCRIPT_EXTERNAL_RAY"] == "1"
    # {{ globals.uuid }} (head) and params (workers) are resolved the way the server/agent do
    assert envs[0]["MILES_OUTPUT_DIR"] == f"/mnt/miles/runs/{RUN_UUID}"
    assert envs[1]["MILES_OUTPUT_DIR"] == "/mnt/miles/runs/worker"


def test_scheduling_and_resources_reach_the_pods(cr):
    head, worker = _groups(cr)
    wspec = worker["template"]["spec"]
    assert wspec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert wspec["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert _main(worker)["resources"]["limits"] == {"nvidia.com/gpu": "8", "cpu": "64"}
    assert "nodeSelector" not in head["template"]["spec"]
    assert "nvidia.com/gpu" not in _main(head)["resources"]["limits"]


def test_pod_templates_are_valid_kubernetes(cr):
    kv = pytest.importorskip("kubernetes_validate")
    assert ps.invalid_volume_names(cr) == []
    for g in _groups(cr):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": g["template"]["spec"]}
        kv.validate(pod, "1.33", strict=True)


UNDERSCORE_STORE = {
    "name": "artifacts_store",
    "kind": "host_path",
    "schema": {"hostPath": "/tmp/plx", "mountPath": "/tmp/plx"},
}


def test_underscore_volume_names_are_renamed_consistently():
    out = ps.to_custom_resource(
        miles_operation(), "polyaxon", RUN_UUID, "miles-qwen3-4b", "miles",
        artifacts_store=UNDERSCORE_STORE,
    )
    assert ps.invalid_volume_names(out) == []
    for g in _groups(out):
        spec = g["template"]["spec"]
        names = {v["name"] for v in spec["volumes"]}
        assert "artifacts-store" in names
        for c in spec["containers"] + spec.get("initContainers", []):
            for m in c.get("volumeMounts", []):
                assert m["name"] in names, (c["name"], m)


def test_underscore_volume_names_reported_when_not_fixed():
    with pytest.raises(SpecError, match="artifacts_store"):
        ps.to_custom_resource(
            miles_operation(), "polyaxon", RUN_UUID, "miles-qwen3-4b", "miles",
            artifacts_store=UNDERSCORE_STORE, fix_volume_names=False,
        )


def test_unknown_connection_is_reported():
    with pytest.raises(SpecError, match="miles-data"):
        ps.to_custom_resource(
            miles_operation(), "polyaxon", RUN_UUID, "miles-qwen3-4b", "miles", connections=[]
        )


def test_agent_config_is_scoped():
    from polyaxon import settings

    before = settings.AGENT_CONFIG
    ps.to_custom_resource(miles_operation(), "polyaxon", RUN_UUID, "miles-qwen3-4b", "miles")
    with pytest.raises(SpecError):
        ps.to_custom_resource(miles_operation(), "polyaxon", RUN_UUID, "m", "miles", connections=[])
    assert settings.AGENT_CONFIG is before


def test_connection_names():
    assert ps.connection_names(miles_operation()) == ["miles-data"]
