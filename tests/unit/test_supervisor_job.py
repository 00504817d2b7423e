"""The run supervisor's Kubernetes objects (miles_ray/core/supervisor_job.py): a ConfigMap with the program and
its spec, a batch/v1 Job in the cluster's pinned image with the cluster's mounts, owned by the RayCluster; valid
Kubernetes objects (kubernetes-validate, strict) and within the restricted Pod Security Standard when the cluster
is."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from miles_ray.core import supervisor_job as sj
from miles_ray.core.builders import build_raycluster
from miles_ray.core.config import load_config
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from tests.conftest import IMAGE

PROGRAM = {"supervise.py": "import supervision\n", "supervision.py": "import metrics\n", "metrics.py": "X = 1\n"}
SPEC = {"run": "r1", "max_restarts": 3}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _raycluster(name: str = "miles-test", **extra) -> dict:
    cfg = load_config({"recipe": "Qwen3-4B", "nodes": 2, "gpus_per_node": 8, "name": name, "namespace": "ml",
                       **extra}, environ={})
    rc = build_raycluster(cfg, plan_split(BUILTIN["Qwen3-4B"], 2, 8), IMAGE, "2.60.0")
    rc["metadata"]["uid"] = "0b5e6c1a-1111-2222-3333-444455556666"  # as the API server gave it
    return rc


def _objects(run: str = "r1", **extra) -> tuple[dict, dict, dict]:
    rc = _raycluster(**extra)
    return rc, sj.build_configmap(rc, run, PROGRAM, SPEC), sj.build_job(rc, run, PROGRAM)


def test_job_and_configmap_are_valid_kubernetes_objects() -> None:
    for extra in ({}, {"pod_security": "restricted", "run_as_user": 1000}, {"ray_auth": "none"}):
        _, cm, job = _objects(**extra)
        kubernetes_validate.validate(cm, "1.30", strict=True)
        kubernetes_validate.validate(job, "1.30", strict=True)


def test_job_runs_the_program_in_the_clusters_image_with_small_requests() -> None:
    rc, cm, job = _objects()
    assert job["metadata"]["name"] == cm["metadata"]["name"] == "r1-supervisor"
    assert job["metadata"]["namespace"] == cm["metadata"]["namespace"] == "ml"
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"]) == (1, 1) and 0 < spec["backoffLimit"] <= 6
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes API access at all
    [c] = pod["containers"]
    assert c["image"] == rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert "@sha256:" in c["image"]  # the cluster's pinned digest
    assert c["command"] == ["python3", "/opt/miles-ray/supervise.py", "--spec", "/opt/miles-ray/spec.json"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    req, lim = c["resources"]["requests"], c["resources"]["limits"]
    assert req == {"cpu": "100m", "memory": "256Mi"}  # at most 0.1 CPU and 256 MiB requested
    assert lim["memory"] == req["memory"] and lim["cpu"] in ("500m", "1")
    assert "nvidia.com/gpu" not in req and "nvidia.com/gpu" not in lim


def test_configmap_holds_the_program_its_modules_and_the_spec_laid_out_under_opt() -> None:
    import json

    _, cm, job = _objects()
    assert json.loads(cm["data"]["spec.json"]) == SPEC
    assert cm["data"]["supervise.py"] == PROGRAM["supervise.py"]
    assert cm["data"]["supervision.py"] == PROGRAM["supervision.py"]
    assert all("/" not in k for k in cm["data"])  # ConfigMap keys allow no '/'
    pod = job["spec"]["template"]["spec"]
    [vol] = [v for v in pod["volumes"] if v["name"] == "supervisor"]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    laid_out = {i["path"]: cm["data"][i["key"]] for i in vol["configMap"]["items"]}
    assert laid_out == {**PROGRAM, "spec.json": cm["data"]["spec.json"]}
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "supervisor"]
    assert mount == {"name": "supervisor", "mountPath": "/opt/miles-ray", "readOnly": True}
    with pytest.raises(ValueError, match="supervise.py"):
        sj.build_configmap(_raycluster(), "r1", {"x.py": ""}, SPEC)


def test_the_clusters_claim_is_mounted_where_the_ray_pods_mount_it() -> None:
    rc, _, job = _objects()
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    pod = job["spec"]["template"]["spec"]
    claim = [v for v in head["volumes"] if "persistentVolumeClaim" in v]
    assert claim and all(v in pod["volumes"] for v in claim)
    ray_mounts = [m for m in head["containers"][0]["volumeMounts"] if m["name"] in {v["name"] for v in claim}]
    assert ray_mounts and all(m in pod["containers"][0]["volumeMounts"] for m in ray_mounts)
    assert not [v for v in pod["volumes"] if "emptyDir" in v]  # not the memory-backed /dev/shm


def test_token_secret_is_mounted_as_a_file_only_with_token_auth() -> None:
    _, _, job = _objects()  # ray_auth token by default: the Secret KubeRay makes, named after the RayCluster
    pod = job["spec"]["template"]["spec"]
    [vol] = [v for v in pod["volumes"] if v["name"] == "ray-token"]
    assert vol["secret"]["secretName"] == "miles-test"
    assert vol["secret"]["items"] == [{"key": "auth_token", "path": "auth_token"}]
    assert {"name": "ray-token", "mountPath": sj.TOKEN_DIR, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert sj.TOKEN_FILE == sj.TOKEN_DIR + "/auth_token"
    assert not [e for e in pod["containers"][0]["env"] if "TOKEN" in e["name"]]  # a file, not an env value
    _, _, named = _objects(ray_auth_secret="my-ray-token")
    [vol] = [v for v in named["spec"]["template"]["spec"]["volumes"] if v["name"] == "ray-token"]
    assert vol["secret"]["secretName"] == "my-ray-token"
    _, _, none = _objects(ray_auth="none")
    assert not [v for v in none["spec"]["template"]["spec"]["volumes"] if v["name"] == "ray-token"]
    rc = _raycluster()  # a Ray container taking its token from a Secret itself (no authOptions)
    del rc["spec"]["authOptions"]
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] += [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "plx-token", "key": "auth_token"}}}]
    assert sj.token_secret(rc) == "plx-token"


def test_owned_by_the_raycluster_and_labelled_with_run_and_cluster() -> None:
    rc, cm, job = _objects()
    for obj in (cm, job):
        [owner] = obj["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "miles-test",
                         "uid": rc["metadata"]["uid"], "blockOwnerDeletion": True}
        assert obj["metadata"]["labels"]["miles-ray/run"] == "r1"
        assert obj["metadata"]["labels"]["miles-ray/cluster"] == "miles-test"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["miles-ray/run"] == "r1" and pod_labels["app.kubernetes.io/component"] == "run-supervisor"
    # never counted as one of the cluster's Ray pods (those are selected by ray.io/cluster)
    assert not [k for k in pod_labels if k.startswith("ray.io/")]
    assert sj.selector("r1") == "app.kubernetes.io/component=run-supervisor,miles-ray/run=r1"


def test_restricted_cluster_gives_a_restricted_supervisor_pod() -> None:
    rc, _, job = _objects(pod_security="restricted", run_as_user=1234)
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"] == head["containers"][0]["securityContext"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"] == head["securityContext"]
    assert all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in pod["volumes"]), pod["volumes"]
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert forbidden not in pod
    _, _, base = _objects()
    assert "securityContext" not in base["spec"]["template"]["spec"]


def test_names_stay_within_63_characters() -> None:
    assert sj.supervisor_name("a" * 40) == "a" * 40 + "-supervisor"
    long = sj.supervisor_name("b" * 70)
    assert len(long) <= 63 and long.endswith("-supervisor") and long != sj.supervisor_name("b" * 69)
    rc = copy.deepcopy(_raycluster())
    job = sj.build_job(rc, "c" * 40, PROGRAM)
    kubernetes_validate.validate(job, "1.30", strict=True)


def test_head_dashboard_by_service_name() -> None:
    assert sj.head_dashboard_url(_raycluster()) == "http://miles-test-head-svc.ml.svc.cluster.local:8265"


def test_job_final_reads_the_conditions() -> None:
    assert sj.job_final(None) is None
    assert sj.job_final({"status": {"active": 1}}) is None
    assert sj.job_final({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "Complete"
    assert sj.job_final({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "Failed"
    assert sj.job_final({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) is None


def test_the_configmap_holds_a_program_that_runs_where_nothing_of_miles_ray_is_installed(tmp_path) -> None:
    """The real program (supervise.py and the modules it imports from its own directory), laid out as the pod
    mounts the ConfigMap, run by a python without site-packages (-S -E: no miles_ray importable): it reads its spec and refuses a
    bad one with exit 2 -- so every import resolved from the mounted directory alone."""
    import json
    import subprocess
    import sys

    from miles_ray.controller.program import program_files

    program = program_files()
    rc = _raycluster()
    cm, job = sj.build_configmap(rc, "r1", program, SPEC), sj.build_job(rc, "r1", program)
    assert sum(len(v.encode()) for v in cm["data"].values()) < 1024 * 1024  # a ConfigMap holds at most 1 MiB
    [vol] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "supervisor"]
    for item in vol["configMap"]["items"]:
        (tmp_path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / item["path"]).write_text(cm["data"][item["key"]])
    assert json.loads((tmp_path / "spec.json").read_text()) == SPEC
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    argv = [sys.executable, "-S", "-E", *[a.replace(sj.ROOT, str(tmp_path)) for a in command[1:]]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "spec" in (proc.stdout + proc.stderr).lower()


def test_the_pod_reaches_the_head_by_service_name_and_reads_the_token_file() -> None:
    """The spec the client built (its head URL a port-forward on this machine, its token file here) is rewritten
    for the pod: the head Service's name and the token file the Job mounts; nothing else changes."""
    from miles_ray.services.runs.supervised_kube import in_cluster_spec

    spec = {"run": "r1", "head_url": "http://127.0.0.1:40123", "token_file": "/home/me/.ray/token", "max_restarts": 3}
    out = in_cluster_spec(spec, _raycluster())
    assert out == {**spec, "head_url": "http://miles-test-head-svc.ml.svc.cluster.local:8265",
                   "token_file": sj.TOKEN_FILE}
    assert in_cluster_spec(spec, _raycluster(ray_auth="none"))["token_file"] is None


def test_the_handle_finds_its_cluster_in_the_run_record_once_it_exists(tmp_path, monkeypatch) -> None:
    """SupervisedRun makes the handle before it writes the run record: the handle reads the record only when
    first asked where the supervisor lives (its start), then keeps it in ``where``."""
    from miles_ray.adapters import state
    from miles_ray.services.runs.supervised_kube import KubeSupervisor

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path))
    handle = KubeSupervisor("r1", None)  # no record yet: nothing read
    state.runs_dir().mkdir(parents=True, exist_ok=True)
    state.save_record({"run": "r1", "address": "k8s://ml/miles-test", "kube_context": "ctx", "kubeconfig": None})
    assert (handle.namespace, handle.cluster) == ("ml", "miles-test")
    assert handle.where == {"namespace": "ml", "cluster": "miles-test", "kube_context": "ctx", "kubeconfig": None}
    assert KubeSupervisor("r1", {"namespace": "a", "cluster": "b"}).namespace == "a"
