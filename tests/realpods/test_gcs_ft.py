"""GCS fault tolerance on real pods (issue 24 item 3): ``miles-ray up --via kuberay --gcs-ft redis://...`` with a real
Redis (Debian's redis-server in the real-pod image, password from a Secret: tests/infra/redis_pod.py) in its own
namespace ``miles-gcsft``.

1. Bad input creates nothing: a Redis that does not answer (a port nothing listens on) and a wrong password are
   refused by the preflight's probe pod (it runs in the namespace, from the cluster's side), one line, exit 2, no
   RayCluster and no probe pod left; a missing password Secret is refused before any pod.
2. ``up`` with the Redis: both GPU workers ALIVE in Ray; KubeRay took the options (its finalizer, the head's
   ``ray.io/ft-enabled`` annotation, the password by reference only).
3. A job whose driver runs on a worker (submitted to Ray's Jobs API with ``entrypoint_num_cpus``; the head has
   num-cpus 0) keeps running while the head pod is deleted: Ray is whole again with the new head, the workers'
   Ray containers are NOT restarted (same container ids, restartCount unchanged), the job stays RUNNING and then
   SUCCEEDED, its driver having used Ray again after the loss. Figures: seconds until the new head serves and
   until both workers are ALIVE again (the tier's SUMMARY figures, not timed assertions).
4. doctor says the cluster has GCS fault tolerance; ``down`` removes the cluster (KubeRay cleans Redis first).

What is fake here, and why: the GPUs (``nvidia.com/gpu`` in the node status, Ray's ``num-gpus``: no GPU on this
machine). The job is a small Python driver, not Miles (what is tested is that Ray's state survives the head).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.infra.fixtures import poll
from tests.infra.realpods import RealPods
from tests.infra.redis_pod import start_redis

pytestmark = pytest.mark.real_pods

NS = "miles-gcsft"
NAME = "gcsft"
GPUS = 2
JOB_SECONDS = 75  # the driver's own length: it must outlast the head's loss and recovery (17-22 s measured here)

# the driver: attaches to Ray, prints a tick a second for JOB_SECONDS, then runs a Ray task (Ray usable again after
# the head's loss) and says so
DRIVER = f"""
import time, ray
ray.init()
start = time.time()
i = 0
while time.time() - start < {JOB_SECONDS}:
    print("TICK", i, flush=True)
    i += 1
    time.sleep(1)
@ray.remote(num_cpus=0.1)
def where():
    return ray.get_runtime_context().get_node_id()
print("TASK_RAN_ON", ray.get(where.remote(), timeout=120), flush=True)
"""


@pytest.fixture(scope="module")
def gcs(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Namespace miles-gcsft with the claim miles-data, a running Redis with its password Secret, and ``mr(*args)``
    running miles-ray with a config like the smoke sequence's (sized for the real nodes' 2 CPUs)."""
    from kubernetes import client

    t = time.monotonic()
    api = real_pods.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    poll(f"ServiceAccount {NS}/default",
         lambda: any(s.metadata.name == "default" for s in core.list_namespaced_service_account(NS).items), 60)
    real_pods.shared_volume(NS, "miles-data")
    redis = start_redis(real_pods, NS)
    real_pods.figures["gcs_ft_redis_up_s"] = redis.started_s
    work = tmp_path_factory.mktemp("gcsft")
    cfg = {"name": NAME, "namespace": NS, "gpus_per_node": GPUS, "cpus_per_node": GPUS + 1,
           "cpu_request_per_node": "250m", "memory_per_node": "2Gi", "head_cpus": 1, "head_memory": "2Gi",
           "volume_claim": "miles-data", "image": real_pods.image, "ray_version": "2.60.0"}
    (work / "miles-ray.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "MILES_RAY_CONFIG": str(work / "miles-ray.yaml"),
           "MILES_RAY_STATE_DIR": str(work / "state"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

    def mr(*args: str, timeout: float = 900) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=work)
        return proc.returncode, proc.stdout, proc.stderr

    ns = SimpleNamespace(api=api, core=core, crd=client.CustomObjectsApi(api), redis=redis, mr=mr, work=work, t0=t)
    try:
        yield ns
    finally:
        # down first (KubeRay's finalizer empties the Redis through a Job that needs it), then the Redis
        try:
            if _rayclusters(ns):
                mr("down", "-y", "--backend", "kubernetes", "--name", NAME, timeout=300)
                poll("the RayCluster to be gone", lambda: not _rayclusters(ns), 420, interval=2,
                     explain=lambda: _cleanup_state(ns))
        finally:
            redis.stop()
            real_pods.figures["gcs_ft_module_s"] = round(time.monotonic() - t, 1)


def _rayclusters(ns: SimpleNamespace) -> list[dict]:
    return ns.crd.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]


def _probe_pods(ns: SimpleNamespace) -> list[Any]:
    return ns.core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=miles-ray-redis-probe").items


def _refused(ns: SimpleNamespace, name: str, *flags: str) -> str:
    """``up --via kuberay`` of cluster ``name`` with ``flags``: exit 2, one error line (returned), nothing created."""
    code, out, err = ns.mr("up", "--via", "kuberay", "--name", name, "--nodes", "2", "--timeout", "300", *flags)
    assert code == 2, (code, out, err[-3000:])
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert not [rc for rc in _rayclusters(ns) if rc["metadata"]["name"] == name]  # nothing created ...
    assert not _probe_pods(ns)  # ... and the probe pod is gone
    return errors[0]


def test_up_refuses_a_redis_that_does_not_answer_and_creates_nothing(gcs: SimpleNamespace,
                                                                     real_pods: RealPods) -> None:
    from kubernetes import client

    no_secret = _refused(gcs, "nosecret", "--gcs-ft", gcs.redis.address, "--gcs-ft-password-secret", "absent")
    assert f"Redis password Secret {NS}/absent does not exist" in no_secret, no_secret
    t = time.monotonic()
    silent = f"redis://{gcs.redis.host}:6380"  # the Redis's own name, a port nothing listens on
    line = _refused(gcs, "silent", "--gcs-ft", silent, "--gcs-ft-password-secret", gcs.redis.secret)
    real_pods.figures["gcs_ft_refused_no_answer_s"] = round(time.monotonic() - t, 1)
    assert f"Redis {silent} does not answer from namespace {NS}" in line and "nothing was created" in line, line
    gcs.core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="wrong-password"),
                                                          string_data={"pw": "not-the-password"}))
    line = _refused(gcs, "wrongpw", "--gcs-ft", gcs.redis.address, "--gcs-ft-password-secret", "wrong-password:pw")
    assert "does not answer" in line and "AUTH answered" in line, line
    assert "not-the-password" not in line


def _token(ns: SimpleNamespace) -> str:
    return base64.b64decode(ns.core.read_namespaced_secret(NAME, NS).data["auth_token"]).decode()


def _head(ns: SimpleNamespace) -> Any | None:
    heads = [p for p in ns.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items
             if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return heads[0] if heads else None


def _ray(ns: SimpleNamespace, path: str, body: dict | None = None) -> tuple[str, Any] | None:
    """(the running head pod's UID, the JSON its dashboard answers ``path`` with; POST when ``body``), through a
    port-forward with the cluster's token. None while there is no running head or it does not answer."""
    from miles_ray.adapters.kube import port_forward

    head = _head(ns)
    if head is None:
        return None
    try:
        with port_forward(ns.api, NS, head.metadata.name, 8265) as url:
            req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {_token(ns)}",
                                                              "Content-Type": "application/json"},
                                         data=json.dumps(body).encode() if body is not None else None)
            with urllib.request.urlopen(req, timeout=15) as resp:
                return head.metadata.uid, json.loads(resp.read())
    except Exception:  # noqa: BLE001 -- a head that is starting or going away: not yet
        return None


def _workers(ns: SimpleNamespace) -> dict[str, tuple[str, str, int]]:
    """Worker pod name -> (IP, the Ray container's id, its restartCount)."""
    out = {}
    for p in ns.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=worker").items:
        ray = next(c for c in p.status.container_statuses or [] if c.name == "ray")
        out[p.metadata.name] = (p.status.pod_ip, ray.container_id, ray.restart_count)
    return out


def _alive(ns: SimpleNamespace) -> list[dict] | None:
    got = _ray(ns, "/api/v0/nodes?limit=1000")
    return None if got is None else [n for n in got[1]["data"]["result"]["result"] if n["state"] == "ALIVE"]


def test_up_with_gcs_ft_then_the_head_lost_under_a_job(gcs: SimpleNamespace, real_pods: RealPods) -> None:
    t = time.monotonic()
    code, out, err = gcs.mr("up", "--via", "kuberay", "--nodes", "2", "--timeout", "600", "-o", "json",
                            "--gcs-ft", gcs.redis.address, "--gcs-ft-password-secret", gcs.redis.secret)
    assert code == 0, err[-4000:]
    real_pods.figures["gcs_ft_up_to_workers_in_ray_s"] = round(time.monotonic() - t, 1)
    up = json.loads(out)
    assert up["status"]["ray"]["gpu_node_count"] == 2  # both GPU workers ALIVE in Ray
    assert up["preflight"]["gcs_ft"].startswith(f"{gcs.redis.address} answered from namespace {NS}")
    assert not _probe_pods(gcs)
    [rc] = _rayclusters(gcs)
    assert rc["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": f"{gcs.redis.host}:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": gcs.redis.secret, "key": "password"}}}}
    assert "ray.io/gcs-ft-redis-cleanup-finalizer" in rc["metadata"].get("finalizers", [])  # KubeRay took it
    head = _head(gcs)
    assert head.metadata.annotations.get("ray.io/ft-enabled") == "true"
    assert gcs.redis.password not in json.dumps(gcs.api.sanitize_for_serialization(head.spec))  # by reference only
    assert gcs.redis.keys() > 0  # Ray's GCS keeps its state in this Redis

    # a job whose driver runs on a worker (the head has num-cpus 0: entrypoint_num_cpus puts it on a worker)
    sid = "gcsft-driver-on-worker"
    program = base64.b64encode(DRIVER.encode()).decode()
    entrypoint = f"python -c \"import base64; exec(base64.b64decode('{program}'))\""
    submitted = _ray(gcs, "/api/jobs/", {"entrypoint": entrypoint, "submission_id": sid, "entrypoint_num_cpus": 0.5})
    assert submitted is not None and submitted[1]["submission_id"] == sid, submitted
    job = poll("the job to run", lambda: (j := _ray(gcs, f"/api/jobs/{sid}")) and j[1]["status"] == "RUNNING"
               and j[1].get("driver_node_id") and j[1], 120)
    nodes = {n["node_id"]: n for n in _alive(gcs) or []}
    assert job["driver_node_id"] in nodes and not nodes[job["driver_node_id"]]["is_head_node"], job
    poll("the driver's first ticks", lambda: "TICK 2" in ((_ray(gcs, f"/api/jobs/{sid}/logs") or ("", {}))[1]
                                                         .get("logs", "")), 60)

    before = _workers(gcs)
    assert len(before) == 2
    old = head.metadata
    t = time.monotonic()
    gcs.core.delete_namespaced_pod(old.name, NS, grace_period_seconds=0)
    poll("the new head to serve", lambda: (got := _ray(gcs, "/api/version")) and got[0] != old.uid, 300)
    real_pods.figures["gcs_ft_head_deleted_to_new_head_serving_s"] = round(time.monotonic() - t, 1)

    def whole() -> bool:
        alive = _alive(gcs)
        if alive is None:
            return False
        heads = [n for n in alive if n["is_head_node"]]
        workers = sorted(n["node_ip"] for n in alive if not n["is_head_node"])
        new_head = _head(gcs)
        return (len(heads) == 1 and new_head is not None and heads[0]["node_ip"] == new_head.status.pod_ip
                and workers == sorted(ip for ip, _, _ in before.values()))

    poll("Ray to be whole again: the new head and both (same) workers ALIVE", whole, 300)
    real_pods.figures["gcs_ft_head_deleted_to_workers_alive_s"] = round(time.monotonic() - t, 1)
    assert _workers(gcs) == before  # the same pods, the same Ray containers, restartCount unchanged

    state = _ray(gcs, f"/api/jobs/{sid}")
    assert state is not None and state[1]["status"] == "RUNNING", state  # the job kept running through it
    done = poll("the job to end", lambda: (j := _ray(gcs, f"/api/jobs/{sid}")) and j[1]["status"] in (
        "SUCCEEDED", "FAILED", "STOPPED") and j[1], JOB_SECONDS + 180)
    real_pods.figures["gcs_ft_job_ended_s_after_head_deleted"] = round(time.monotonic() - t, 1)
    logs = (_ray(gcs, f"/api/jobs/{sid}/logs") or ("", {}))[1].get("logs", "")
    assert done["status"] == "SUCCEEDED", (done, logs[-3000:])
    ticks = [int(ln.split()[1]) for ln in logs.splitlines() if ln.startswith("TICK ")]
    assert ticks == list(range(len(ticks))) and len(ticks) >= JOB_SECONDS - 5, ticks[-5:]  # no gap, no restart
    assert "TASK_RAN_ON " in logs  # Ray usable from the driver after the head's loss
    assert _workers(gcs) == before


def test_doctor_sees_gcs_ft_and_down_removes_the_cluster(gcs: SimpleNamespace, real_pods: RealPods) -> None:
    code, out, err = gcs.mr("doctor", NAME, "--backend", "kubernetes", "-o", "json")
    assert code in (0, 4), err[-3000:]
    finding = next(f for f in json.loads(out)["findings"] if f["check"] == "gcs_ft")
    assert finding["status"] == "ok" and f"{gcs.redis.host}:6379" in finding["summary"], finding
    t = time.monotonic()
    code, out, err = gcs.mr("down", "-y", "--backend", "kubernetes", "-o", "json")
    assert code == 0 and json.loads(out)["deleted"] is True, err[-3000:]
    # KubeRay's finalizer first runs its Redis cleanup Job (in the Ray image: it needs the Redis, still up), then
    # lets the RayCluster go; down waits 120 s for that, a loaded machine may need longer
    poll("the RayCluster and its pods (the Redis cleanup Job's too) to be gone",
         lambda: not _rayclusters(gcs) and not gcs.core.list_namespaced_pod(
             NS, label_selector=f"ray.io/cluster={NAME}").items, 420, interval=2, explain=lambda: _cleanup_state(gcs))
    real_pods.figures["gcs_ft_down_to_raycluster_gone_s"] = round(time.monotonic() - t, 1)
    assert gcs.redis.keys() == 0, "KubeRay's cleanup left Ray's state in the Redis: " + _cleanup_state(gcs)


def _cleanup_state(ns: SimpleNamespace) -> str:
    """What KubeRay's Redis cleanup is doing: the RayCluster's finalizers, the cleanup Job's pods and their logs."""
    lines = [f"RayCluster finalizers: {[rc['metadata'].get('finalizers') for rc in _rayclusters(ns)]}"]
    for p in ns.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items:
        states = [(c.name, c.state.to_dict()) for c in p.status.container_statuses or []]
        lines.append(f"pod {p.metadata.name}: {p.status.phase} {states}"[:1500])
        try:
            lines.append(ns.core.read_namespaced_pod_log(p.metadata.name, NS, _preload_content=False,
                                                         tail_lines=30).data.decode(errors="replace"))
        except Exception as e:  # noqa: BLE001 -- diagnosis only
            lines.append(f"(no log: {e})"[:300])
    return "\n".join(lines)
