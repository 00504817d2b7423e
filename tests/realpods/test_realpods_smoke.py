"""Ray really runs in KubeRay's pods: real kubelets, real containerd, workers on two real nodes.

One control plane + ``real-cpu-0`` (the head) + ``real-gpu-0/1`` (2 fake GPUs each), all in a
network namespace of their own (tests/infra/realpods.py). A RayCluster rendered by
``miles-ray render -F kuberay`` (the local image, 2 workers x 2 GPUs) is applied as is, except
``imagePullPolicy: Never`` (tests.infra.realpods.fit_to_real_nodes; the workers' CPU request is the
product's own ``cpu_request_per_node``: each real node has this machine's 2 CPUs); Ray on
the head, reached through a port-forward, must list both GPU workers ALIVE on two node IPs; a job
submitted through the Jobs API must succeed; the teardown must leave nothing on the machine.

What is fake here, and why: the GPUs (``nvidia.com/gpu`` patched into the node status; Ray's GPU
count comes from ``num-gpus``) — there is no GPU on this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra.fixtures import poll
from tests.infra.realpods import RealPods, fakegpu, fit_to_real_nodes, realnodes

pytestmark = pytest.mark.real_pods

REPO = Path(__file__).resolve().parents[2]
NS = "smoke"
NAME = "smoke"
FATAL = {"ErrImageNeverPull", "InvalidImageName", "CrashLoopBackOff", "CreateContainerError",
         "CreateContainerConfigError", "RunContainerError"}
SMOKE_JOB = """\
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
print("SMOKE_GPUS", ray.cluster_resources().get("GPU"))
pg = placement_group([{"GPU": 2, "CPU": 1}, {"GPU": 2, "CPU": 1}], strategy="STRICT_SPREAD")
ready, _ = ray.wait([pg.ready()], timeout=60)
assert ready, "the 2 x 2-GPU placement group did not become ready in 60 s"


@ray.remote(num_gpus=2)
def where():
    return ray.util.get_node_ip_address(), ray.get_gpu_ids()


res = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
               .remote() for i in range(2)])
print("SMOKE_IPS", sorted(r[0] for r in res))
print("SMOKE_GPU_IDS", sorted(len(r[1]) for r in res))
"""


@pytest.fixture
def cluster(real_pods: RealPods) -> RealPods:
    """The tier's one real-pod cluster (session fixture; tests/realpods/test_zz_teardown.py stops it)."""
    return real_pods


def test_real_nodes_are_ready_with_fake_gpus(cluster: RealPods) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api_client())
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == set(cluster.cpu_nodes + cluster.gpu_nodes) == {"real-cpu-0", "real-gpu-0", "real-gpu-1"}
    ips = set()
    for name, n in nodes.items():
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions), name
        info = n.status.node_info
        assert info.kubelet_version == fakegpu.read_versions()["KUBERNETES_VERSION"]
        assert info.container_runtime_version.startswith("containerd://1.6.")
        ips.update(a.address for a in n.status.addresses if a.type == "InternalIP")
        gpus = n.status.allocatable.get("nvidia.com/gpu")
        if name in cluster.gpu_nodes:
            assert gpus == "2" and n.metadata.labels["nvidia.com/gpu.present"] == "true"
            assert [(t.key, t.effect) for t in n.spec.taints or []] == [("nvidia.com/gpu", "NoSchedule")]
        else:
            assert gpus is None and not n.spec.taints
    assert len(ips) == 3
    assert cluster.image.startswith("milesray.local/ray:2.60.0-") and "@sha256:" in cluster.image


def _render(cluster: RealPods, tmp_path: Path) -> dict[str, Any]:
    cfg = tmp_path / "miles-ray.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": NAME, "namespace": NS, "nodes": 2, "gpus_per_node": 2,
        "cpus_per_node": 3, "cpu_request_per_node": "250m", "memory_per_node": "2Gi", "head_cpus": 1, "head_memory": "2Gi",
        "node_selector": {"milesray.io/real-node": "true"},
    }))
    out = subprocess.run(
        [sys.executable, "-m", "miles_ray", "render", "-F", "kuberay", "-c", str(cfg), "--image", cluster.image,
         "--ray-version", "2.60.0", "--recipe", "Qwen3-4B"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def _pods_explained(core: Any) -> str:
    lines = []
    for p in core.list_namespaced_pod(NS).items:
        states = [(c.name, c.state.waiting.reason if c.state.waiting else "running" if c.state.running else "terminated")
                  for c in (p.status.container_statuses or []) + (p.status.init_container_statuses or [])]
        lines.append(f"{p.metadata.name} {p.status.phase} node={p.spec.node_name} {states}")
    for e in core.list_namespaced_event(NS).items[-15:]:
        lines.append(f"event {e.involved_object.name}: {e.reason}: {e.message}")
    return "\n".join(lines)


def _ray_nodes(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/api/v0/nodes?detail=1", headers=headers), timeout=10) as r:
            return json.loads(r.read())["data"]["result"]["result"]
    except (OSError, ValueError, KeyError):
        return []


def test_raycluster_from_render_runs_ray_on_real_nodes(cluster: RealPods, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client
    from kubernetes.stream import stream

    from miles_ray.adapters.kube import head_ray_token, port_forward

    api = cluster.api_client()
    core = client.CoreV1Api(api)
    crd = client.CustomObjectsApi(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    poll("ServiceAccount smoke/default",
             lambda: any(s.metadata.name == "default" for s in core.list_namespaced_service_account(NS).items), 60)
    cluster.shared_volume(NS, "miles-data")
    rc = fit_to_real_nodes(_render(cluster, tmp_path))

    t_apply = time.monotonic()
    crd.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)

    def pods_ready() -> list[Any] | None:
        pods = core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
        for p in pods:  # a pod that cannot start fails the test at once
            for c in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
                if c.state.waiting and c.state.waiting.reason in FATAL:
                    pytest.fail(f"{p.metadata.name}: {c.state.waiting.reason}\n{_pods_explained(core)}", pytrace=False)
        ok = [p for p in pods if p.status.phase == "Running"
              and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return pods if len(pods) == 3 and len(ok) == 3 else None

    pods = poll("head + 2 worker pods Running and Ready", pods_ready, 300, 1, lambda: _pods_explained(core))
    cluster.figures["apply_to_pods_ready_s"] = round(time.monotonic() - t_apply, 1)
    head = next(p for p in pods if p.metadata.labels["ray.io/node-type"] == "head")
    workers = [p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker"]
    assert head.spec.node_name == "real-cpu-0"
    assert sorted(p.spec.node_name for p in workers) == ["real-gpu-0", "real-gpu-1"]
    worker_ips = {p.status.pod_ip for p in workers}

    # Pods know one resolver only: the stub inside the namespace (the machine's is never used).
    resolv = stream(core.connect_get_namespaced_pod_exec, workers[0].metadata.name, NS, container="ray",
                    command=["cat", "/etc/resolv.conf"], stderr=True, stdin=False, stdout=True, tty=False)
    assert [ln.split()[1] for ln in resolv.splitlines() if ln.startswith("nameserver")] == [realnodes.DNS_IP]

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # the rendered RayCluster has token auth (authOptions): the token of the Secret KubeRay made goes with each call
    auth = {"Authorization": f"Bearer {head_ray_token(api, NS, NAME, head)}"}
    with port_forward(api, NS, head.metadata.name, 8265) as url:
        def workers_joined() -> list[dict[str, Any]] | None:
            alive = [n for n in _ray_nodes(url, auth) if n.get("state") == "ALIVE" and not n.get("is_head_node")]
            gpu = [n for n in alive if n.get("resources_total", {}).get("GPU") == 2.0]
            return gpu if len(gpu) == 2 and len({n["node_ip"] for n in gpu}) == 2 else None

        joined = poll("both GPU workers ALIVE in Ray with 2 GPUs each", workers_joined, 180, 1,
                          lambda: json.dumps(_ray_nodes(url, auth))[:3000])
        cluster.figures["apply_to_workers_joined_s"] = round(time.monotonic() - t_apply, 1)
        assert {n["node_ip"] for n in joined} == worker_ips  # Ray's nodes are the pods, on two real nodes

        from ray.job_submission import JobStatus, JobSubmissionClient

        jobs = JobSubmissionClient(url, headers=auth)
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "smoke_job.py").write_text(SMOKE_JOB)
        t_submit = time.monotonic()
        # working_dir: the package goes up through the port-forward too, as with `submit`.
        job = jobs.submit_job(entrypoint="python smoke_job.py", runtime_env={"working_dir": str(tmp_path / "job")})
        status = poll("the job to finish", lambda: (s := jobs.get_job_status(job)).is_terminal() and s, 180, 1)
        cluster.figures["submit_to_succeeded_s"] = round(time.monotonic() - t_submit, 1)
        logs = jobs.get_job_logs(job)
        assert status == JobStatus.SUCCEEDED, logs
        assert "SMOKE_GPUS 4.0" in logs
        assert f"SMOKE_IPS {sorted(worker_ips)}" in logs  # one 2-GPU task in each worker pod
        assert "SMOKE_GPU_IDS [2, 2]" in logs
        cluster.figures["memory_with_ray_mib"] = cluster.memory()

    t = time.monotonic()
    crd.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", NAME)
    poll("the RayCluster's pods to be gone",
             lambda: not core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items, 120, 1)
    cluster.figures["delete_to_pods_gone_s"] = round(time.monotonic() - t, 1)
