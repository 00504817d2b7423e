"""Runs that finish on their own, on real pods (issue 24): ``submit --max-restarts`` on a KubeRay cluster starts the
run's supervisor as a Kubernetes Job beside the RayCluster (miles_ray/core/supervisor_job.py), which carries the run
through a lost worker pod, resuming from the run's last complete checkpoint.

One namespace with a real Redis (Debian's redis-server in a pod image built like the Ray image, its password in a
Secret: tests/infra/redis_pod.py). First, with no cluster yet, ``up --gcs-ft`` refuses a Redis that does not answer
from the cluster (the preflight's probe pod) and a missing password Secret, creating nothing. Then one cluster for
the module (``up --via kuberay --nodes 2 --gcs-ft`` with that Redis; KubeRay took the options, doctor sees them; the
namespace then enforces the restricted Pod Security Standard), downed at the end (KubeRay's cleanup empties the
Redis). Scenarios: a worker pod lost (resumed from the last checkpoint, figures), the head pod lost (GCS fault
tolerance: the workers' containers are not restarted; a driver on a worker keeps running through it; the run's
driver, which ran on the head, is resubmitted), the submitting CLI killed, a bad flag, stop while the supervisor
waits for workers, the restart budget spent, and an UNsupervised run's job lost with the head while the new head
(GCS fault tolerance) still says it is RUNNING: ``status RUN`` read then.

What is fake here, and why: the GPUs (no GPU on this machine) and Miles's ``train.py``: the FAKE checkpointing
trainer tests/fakes/fake_ckpt_train.py (steps of about a second on actors on both GPU workers, a checkpoint every K
steps in Megatron's layout, resumes from ``--load``), placed on the shared volume as ``miles_root``/train.py: real
training needs GPUs and Miles' image.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.infra.fixtures import poll
from tests.infra.realpods import RealPods
from tests.infra.redis_pod import start_redis

pytestmark = pytest.mark.real_pods

REPO = Path(__file__).resolve().parents[2]
SEQUENCE = REPO / "scripts" / "smoke-sequence.sh"
NS = "miles-sup"
NAME = "sup"
GPUS = 2


K = 3  # the trainer checkpoints every K steps
TARGET = 12  # steps of a run (rollout ids 0..TARGET-1), about a second each
BEST = 8  # with evals (MILESRAY_TEST_FAKE_EVAL_PEAK): the best checkpoint, neither the newest (11) nor one a resume loads
RETENTION = ("--keep-checkpoints", "1", "--keep-best", "eval/score", "--env", f"MILESRAY_TEST_FAKE_EVAL_PEAK={BEST}")
STEP_SECONDS = 1
STEP_LINE = re.compile(r"\] actor\.py:\d+ - step (\d+): ")
BAD_FLAG = "--bogus-flag"

# a driver that ticks each second until the file {stop} exists (at most 10 min), then runs a Ray task: Ray usable
SIDE_DRIVER = """
import os, time, ray
ray.init()
print("DRIVER_STARTED", flush=True)
start, i = time.time(), 0
while not os.path.exists({stop!r}) and time.time() - start < 600:
    print("TICK", i, flush=True)
    i += 1
    time.sleep(1)
@ray.remote(num_cpus=0.1)
def where():
    return ray.get_runtime_context().get_node_id()
print("TASK_RAN_ON", ray.get(where.remote(), timeout=120), flush=True)
"""


def prepare(real_pods: RealPods, work: Path) -> SimpleNamespace:
    """Namespace miles-sup, claim miles-data with the FAKE trainer as miles_root/train.py and a real Redis with its
    password Secret (tests/infra/redis_pod.py); ``.mr(*args)`` runs miles-ray against it, ``.teardown()`` removes
    whatever is left in the namespace (a RayCluster included: the next module needs the GPUs) and the namespace."""
    from kubernetes import client

    api = real_pods.api_client()
    core = client.CoreV1Api(api)
    crd = client.CustomObjectsApi(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    poll(f"ServiceAccount {NS}/default",
         lambda: any(s.metadata.name == "default" for s in core.list_namespaced_service_account(NS).items), 60)
    volume = real_pods.shared_volume(NS, "miles-data")
    volume.chmod(0o777)  # writable by the pods' non-root uid (a real RWX class would use fsGroup)
    (volume / "fake-miles").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_ray_ckpt_train.py", volume / "fake-miles" / "train.py")
    shutil.copy(REPO / "tests" / "fakes" / "fake_ckpt_train.py", volume / "fake-miles" / "fake_ckpt_train.py")
    env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "SMOKE_IMAGE": real_pods.image,
           "SMOKE_NAMESPACE": NS, "SMOKE_NAME": NAME, "SMOKE_GPUS_PER_NODE": str(GPUS),
           "SMOKE_WORKER_MEMORY": "2Gi", "SMOKE_HEAD_MEMORY": "2Gi", "SMOKE_CPU_REQUEST": "250m"}
    cfg = yaml.safe_load(subprocess.run(["bash", str(SEQUENCE), "--print-config"], env=env, capture_output=True,
                                        text=True, timeout=60, check=True).stdout)
    cfg.update(miles_root="/mnt/miles/fake-miles", image=real_pods.image, ray_version="2.60.0",
               pod_security="restricted")
    work.mkdir(parents=True, exist_ok=True)
    (work / "miles-ray.yaml").write_text(yaml.safe_dump(cfg))
    run_env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "MILES_RAY_CONFIG": str(work / "miles-ray.yaml"),
               "MILES_RAY_STATE_DIR": str(work / "state"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

    def mr(*args: str, timeout: float = 900) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", *args], env=run_env, capture_output=True,
                              text=True, timeout=timeout, cwd=work)
        return proc.returncode, proc.stdout, proc.stderr

    redis = start_redis(real_pods, NS)
    real_pods.figures["gcs_ft_redis_up_s"] = redis.started_s
    ns = SimpleNamespace(api=api, core=core, crd=crd, volume=volume, work=work, env=run_env, mr=mr, redis=redis)

    def teardown() -> None:
        try:
            for rc in _rayclusters(ns):  # left by a failed test or down: deleted while the Redis still answers
                crd.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc["metadata"]["name"])
            poll("the RayCluster to be gone", lambda: not _rayclusters(ns), 420, interval=2,
                 explain=lambda: _cleanup_state(ns))
        finally:
            redis.stop()
            poll("every pod of the namespace to be gone", lambda: not core.list_namespaced_pod(NS).items, 180)
            core.delete_namespace(NS)

    ns.teardown = teardown
    return ns


def up_gcs_ft(ns: SimpleNamespace) -> None:
    """``up --via kuberay --nodes 2 --gcs-ft`` with the Redis; then the namespace enforces the restricted Pod Security
    Standard (every supervisor pod is admitted under it). Sets ``.up`` (its JSON) and ``.up_s``."""
    t = time.monotonic()
    code, out, err = ns.mr("up", "--via", "kuberay", "--nodes", "2", "--timeout", "600", "-o", "json",
                           "--gcs-ft", ns.redis.address, "--gcs-ft-password-secret", ns.redis.secret)
    assert code == 0, err[-4000:]
    ns.up, ns.up_s = json.loads(out), round(time.monotonic() - t, 1)
    ns.core.patch_namespace(NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                                        "pod-security.kubernetes.io/enforce-version": "latest"}}})


def down_gcs_ft(ns: SimpleNamespace) -> float:
    """``down``, then the RayCluster gone (KubeRay's GCS fault tolerance finalizer first empties the Redis through a
    cleanup Job that needs it; ``down`` waits 120 s for that, a loaded machine may need longer). Seconds taken."""
    t = time.monotonic()
    code, out, err = ns.mr("down", "-y", "--backend", "kubernetes", "-o", "json", timeout=600)
    assert code == 0 and json.loads(out)["deleted"] is True, err[-3000:]
    poll("the RayCluster and its pods (the Redis cleanup Job's too) to be gone",
         lambda: not _rayclusters(ns) and not ns.core.list_namespaced_pod(
             NS, label_selector=f"ray.io/cluster={NAME}").items, 420, interval=2, explain=lambda: _cleanup_state(ns))
    return round(time.monotonic() - t, 1)


def bring_up(real_pods: RealPods, work: Path) -> SimpleNamespace:
    """:func:`prepare` and :func:`up_gcs_ft`; ``.down()`` deletes it all (benchmarks/bench_supervised.py)."""
    ns = prepare(real_pods, work)
    try:
        up_gcs_ft(ns)
    except BaseException:
        ns.teardown()
        raise

    def down() -> None:
        try:
            down_gcs_ft(ns)
        finally:
            ns.teardown()

    ns.down = down
    return ns


def _rayclusters(ns: SimpleNamespace) -> list[dict]:
    return ns.crd.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]


def _cleanup_state(ns: SimpleNamespace) -> str:
    """What KubeRay's Redis cleanup is doing: the RayCluster's finalizers, the cleanup Job's pods and their logs."""
    from miles_ray.adapters.kube.client import pod_log

    lines = [f"RayCluster finalizers: {[rc['metadata'].get('finalizers') for rc in _rayclusters(ns)]}"]
    for p in ns.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items:
        states = [(c.name, c.state.to_dict()) for c in p.status.container_statuses or []]
        lines.append(f"pod {p.metadata.name}: {p.status.phase} {states}"[:1500])
        try:
            lines.append(pod_log(ns.core, p.metadata.name, NS, tail_lines=30))
        except Exception as e:  # noqa: BLE001 -- diagnosis only
            lines.append(f"(no log: {e})"[:300])
    return "\n".join(lines)


@pytest.fixture(scope="module")
def gcs(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory):
    """The module's namespace and Redis (:func:`prepare`), before any cluster; torn down at the very end."""
    t = time.monotonic()
    ns = prepare(real_pods, tmp_path_factory.mktemp("supervised"))
    try:
        yield ns
    finally:
        ns.teardown()
        real_pods.figures["supervised_module_s"] = round(time.monotonic() - t, 1)


@pytest.fixture(scope="module")
def cluster(gcs: SimpleNamespace, real_pods: RealPods):
    """The module's one cluster (:func:`up_gcs_ft`), downed at the end: the supervisor Jobs go with it, and KubeRay's
    cleanup leaves nothing of Ray's state in the Redis."""
    up_gcs_ft(gcs)
    real_pods.figures["supervised_up_s"] = gcs.up_s
    yield gcs
    real_pods.figures["gcs_ft_down_to_raycluster_gone_s"] = down_gcs_ft(gcs)
    assert gcs.redis.keys() == 0, "KubeRay's cleanup left Ray's state in the Redis: " + _cleanup_state(gcs)
    _outputs_kept_at_down(gcs, real_pods)


def _outputs_kept_at_down(ns: SimpleNamespace, real_pods: RealPods) -> None:
    """Issue 37: ``down`` kept each run's checkpoint listing (read on the cluster before it went): ``runs outputs``
    now shows it marked as last seen, each checkpoint as it is on the claim."""
    t = time.monotonic()
    for path in sorted((ns.work / "state" / "runs").glob("*.json")):
        record = json.loads(path.read_text())
        if not record.get("checkpoint_dir"):
            continue
        claim = ns.volume / Path(record["checkpoint_dir"]).relative_to("/mnt/miles")
        on_claim = {int(p.name[5:]): sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                    for p in claim.glob("iter_*")}
        listed = _json(ns.mr("runs", "outputs", record["run"], "-o", "json"))
        assert listed["seen"]["live"] is False and listed["seen"]["at"], listed["seen"]
        rows = {r["iteration"]: r["bytes"] for r in listed["checkpoints"] if r["state"] != "deleted"}
        assert rows == on_claim, (record["run"], rows, on_claim)
    real_pods.figures["runs_outputs_after_down_s"] = round(time.monotonic() - t, 1)


# ---- GCS fault tolerance: bad input first (no cluster yet), then what KubeRay took -------------------------------

def _probe_pods(ns: SimpleNamespace) -> list:
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
    """Refused by the preflight's probe pod (it runs in the namespace, from the cluster's side): a port nothing
    listens on and a wrong password; a missing password Secret before any pod. One line, exit 2, nothing left."""
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


def test_up_with_gcs_ft_gives_kuberay_the_options_and_doctor_sees_them(cluster: SimpleNamespace,
                                                                       real_pods: RealPods) -> None:
    up = cluster.up
    assert up["status"]["ray"]["gpu_node_count"] == 2  # both GPU workers ALIVE in Ray
    assert up["preflight"]["gcs_ft"].startswith(f"{cluster.redis.address} answered from namespace {NS}")
    assert not _probe_pods(cluster)
    [rc] = _rayclusters(cluster)
    assert rc["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": f"{cluster.redis.host}:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": cluster.redis.secret, "key": "password"}}}}
    assert "ray.io/gcs-ft-redis-cleanup-finalizer" in rc["metadata"].get("finalizers", [])  # KubeRay took it
    [head] = cluster.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items
    assert head.metadata.annotations.get("ray.io/ft-enabled") == "true"
    assert cluster.redis.password not in json.dumps(cluster.api.sanitize_for_serialization(head.spec))  # by reference
    assert cluster.redis.keys() > 0  # Ray's GCS keeps its state in this Redis
    code, out, err = cluster.mr("doctor", NAME, "--backend", "kubernetes", "-o", "json")
    assert code in (0, 4), err[-3000:]
    finding = next(f for f in json.loads(out)["findings"] if f["check"] == "gcs_ft")
    assert finding["status"] == "ok" and f"{cluster.redis.host}:6379" in finding["summary"], finding


def trainer_args(steps: int, extra_args: str = "") -> list[str]:
    """submit's flags for the FAKE trainer: ``steps`` steps of ~1 s on Ray actors on both GPU workers, a checkpoint
    every K."""
    return ["--num-rollout", str(steps), "--extra-args", f"--save-interval {K} {extra_args}".strip(),
            "--env", f"MILESRAY_TEST_STEP_SECONDS={STEP_SECONDS}", "--env", "MILESRAY_TEST_GPU_WORKERS=2",
            "--env", f"MILESRAY_TEST_GPUS_PER_WORKER={GPUS}"]


# ---- helpers ------------------------------------------------------------------------------------------------

def _json(code_out_err: tuple[int, str, str], want: int | None = 0) -> dict:
    code, out, err = code_out_err
    assert want is None or code == want, f"exit {code} (want {want}): {err[-3000:]}\n{out[-3000:]}"
    return json.loads(out)


def _submit(live: SimpleNamespace, run: str, steps: int = TARGET, restarts: int = 3, extra_args: str = "",
            more: tuple[str, ...] = ()) -> dict:
    """``submit --max-restarts`` of the FAKE checkpointing trainer (``steps`` steps, a checkpoint every K); ``more``:
    submit's own flags besides."""
    return _json(live.mr(*_submit_args(run, steps=steps, restarts=restarts, extra_args=extra_args, more=more)))


def _submit_args(run: str, steps: int = TARGET, restarts: int = 3, extra_args: str = "",
                 more: tuple[str, ...] = ()) -> list[str]:
    return ["submit", "--mode", "direct", "--nodes", "2", "--run", run, "--no-check-data", "--no-follow",
            "--no-memory-check",  # a STAND-IN trainer in 2Gi pods, not Qwen3-4B
            "--max-restarts", str(restarts), *trainer_args(steps, extra_args), *more, "-o", "json"]


def _status(live: SimpleNamespace, run: str) -> dict:
    code, out, err = live.mr("status", run, "-o", "json")
    assert out.strip(), f"status {run}: exit {code}: {err[-2000:]}"
    return json.loads(out)


def _until_final(live: SimpleNamespace, run: str, timeout: float = 600) -> dict:
    return poll(f"run {run} to end", lambda: (st := _status(live, run))["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
                and st, timeout, interval=2, explain=lambda: json.dumps(_status(live, run))[-3000:])


def _head_api(live: SimpleNamespace, path: str, body: dict | None = None):
    """The JSON the running head's dashboard answers ``GET path`` (``POST`` of ``body``) with, through a port-forward
    to the pod with KubeRay's token: read here, not through any miles-ray verb. None while it does not answer."""
    import urllib.request

    from miles_ray.adapters.kube import port_forward

    heads = [p for p in live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items
             if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    if not heads:
        return None
    token = base64.b64decode(live.core.read_namespaced_secret(NAME, NS).data["auth_token"]).decode()
    try:
        with port_forward(live.api, NS, heads[0].metadata.name, 8265) as url:
            req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}",
                                                              "Content-Type": "application/json"},
                                         data=None if body is None else json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())
    except Exception:  # noqa: BLE001 -- a head that is starting or going away: not yet
        return None


def _ray_jobs(live: SimpleNamespace, run: str) -> list[dict]:
    """The run's jobs in Ray's own job table (every attempt), oldest first."""
    jobs = poll("Ray's job list", lambda: _head_api(live, "/api/jobs/"), 60)
    mine = [j for j in jobs if (j.get("metadata") or {}).get("miles_ray_run") == run]
    return sorted(mine, key=lambda j: j.get("start_time") or 0)


def _job_logs(live: SimpleNamespace, sid: str) -> str:
    got = _head_api(live, f"/api/jobs/{sid}/logs")
    return (got or {}).get("logs") or ""


def _steps(text: str) -> list[int]:
    """The training steps a trainer's log says it trained, in order."""
    return [int(m.group(1)) for m in STEP_LINE.finditer(text)]


def _never_two_drivers(jobs: list[dict]) -> None:
    """Ray's own job table: no two jobs of the run were running at once (each started after the one before ended)."""
    for before, after in zip(jobs, jobs[1:]):
        assert before.get("end_time") and after["start_time"] >= before["end_time"], (before, after)


def _supervisor_pods(live: SimpleNamespace, run: str) -> list:
    from miles_ray.core.supervisor_job import selector

    return live.core.list_namespaced_pod(NS, label_selector=selector(run)).items


def _workers(live: SimpleNamespace) -> list:
    return [p for p in live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=worker").items
            if p.metadata.deletion_timestamp is None]


def _ray_nodes(live: SimpleNamespace) -> list[dict]:
    """Ray's node table as the head's dashboard lists it (empty while the head does not answer)."""
    got = _head_api(live, "/api/v0/nodes?limit=1000&detail=true") or {}  # (detail: start_time_ms)
    return got.get("data", {}).get("result", {}).get("result", [])


def _gpu_workers_in_ray(live: SimpleNamespace) -> int:
    """GPU workers in Ray now: ALIVE GPU nodes that are worker pods existing now, started after their pod was made. A
    node of a pod deleted a moment ago stays ALIVE until its health checks fail (and its IP may be its replacement's):
    counted, it stood in for the replacement, and the next submit found one GPU node fewer than this said."""
    made = {p.status.pod_ip: p.metadata.creation_timestamp.timestamp() * 1000
            for p in _workers(live) if p.status.pod_ip}
    return len({n["node_ip"] for n in _ray_nodes(live)
                if n["state"] == "ALIVE" and n["resources_total"].get("GPU", 0) > 0 and n["node_ip"] in made
                and (n.get("start_time_ms") or 0) >= made[n["node_ip"]] - 1000})


def _rss_mib(live: SimpleNamespace, pod: str) -> float:
    """The supervisor process's resident memory (VmRSS of PID 1 of its container), through exec."""
    from kubernetes.stream import stream

    text = stream(live.core.connect_get_namespaced_pod_exec, pod, NS, container="supervisor",
                  command=["cat", "/proc/1/status"], stderr=True, stdin=False, stdout=True, tty=False)
    kib = next(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("VmRSS:"))
    return round(kib / 1024, 1)


# ---- the scenarios ------------------------------------------------------------------------------------------

def worker_loss(live: SimpleNamespace, run: str, watch: bool = False, retention: bool = False) -> dict:
    """A worker pod deleted (grace 0) while the run trains, past its first checkpoint: the supervisor waits for the
    replacement worker in Ray and starts attempt 2 from the last complete checkpoint. Returns the figures and
    what the assertions need (shared with benchmarks/bench_supervised.py). ``watch``: a ``status RUN --watch``
    without a terminal follows the run from its submission (``watcher``: its process, ended with the run).
    ``retention``: submitted with :data:`RETENTION` (evals every K, peaking at checkpoint :data:`BEST`)."""
    first = _submit(live, run, **({"extra_args": f"--eval-interval {K} --eval-prompt-data score /dev/null",
                                   "more": RETENTION} if retention else {}))
    assert first["created"] is True, first
    watcher = subprocess.Popen([sys.executable, "-m", "miles_ray", "status", run, "--watch"], env=live.env,
                               cwd=live.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True) if watch else None
    sid = first["submission_id"]
    poll("the supervisor pod to run", lambda: any(p.status.phase == "Running" for p in _supervisor_pods(live, run)),
         120)
    # past the first checkpoint, and not at the end
    poll(f"attempt 1 to train past step {K + 1}", lambda: len(_steps(_job_logs(live, sid))) > K + 1, 300)
    [sup_pod] = [p for p in _supervisor_pods(live, run) if p.status.phase == "Running"]
    rss = _rss_mib(live, sup_pod.metadata.name)
    victim = _workers(live)[0]
    t = time.monotonic()
    live.core.delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)
    poll("attempt 2 to train its first step", lambda: _steps(_job_logs(live, f"{sid}-a2")), 300, interval=0.5)
    resumed_s = round(time.monotonic() - t, 1)
    st = _until_final(live, run)
    jobs = _ray_jobs(live, run)
    logs = [_job_logs(live, j["submission_id"]) for j in jobs]
    return {"status": st, "jobs": jobs, "logs": logs, "sid": sid, "supervisor_pod": sup_pod, "watcher": watcher,
            "figures": {"worker_deleted_to_training_resumed_s": resumed_s, "supervisor_rss_mib": rss,
                        # Miles' numbering: checkpoint N holds rollout N; the rollouts after it are trained twice
                        "steps_lost": max(_steps(logs[0])) - st["attempts"][1]["resumed_iteration"]
                        if st["attempts"][1].get("resumed_iteration") is not None else max(_steps(logs[0])) + 1
                        if len(logs) > 1 and len(st["attempts"]) > 1 else None}}


def test_a_worker_pod_lost_mid_run_is_resumed_from_the_last_checkpoint(cluster: SimpleNamespace,
                                                                       real_pods: RealPods) -> None:
    got = worker_loss(cluster, "workerloss", watch=True, retention=True)
    st, jobs, logs = got["status"], got["jobs"], got["logs"]
    # status RUN --watch without a terminal followed the whole run: its rollouts, the attempt change and the resume,
    # and it ended by itself when the run did, with status's exit code for SUCCEEDED
    try:
        watched, watch_err = got["watcher"].communicate(timeout=120)
    finally:
        got["watcher"].kill()
    assert got["watcher"].returncode == 0, watch_err[-2000:]
    lines = watched.splitlines()
    assert lines[0].startswith("run workerloss: "), watched[:2000]
    assert lines[-1].startswith("run workerloss: SUCCEEDED"), watched[-2000:]
    assert any(ln.startswith("attempt 1 ended FAILED") and "retried" in ln for ln in lines), watched[-4000:]
    [started2] = [ln for ln in lines if ln.startswith("attempt 2 started")]
    assert f"iter {st['attempts'][1]['resumed_iteration']}, from rollout" in started2, started2
    after = lines[lines.index(started2):]
    watched_rollouts = [int(ln.split()[1]) for ln in after if ln.startswith("rollout ") and "attempt 2" in ln]
    assert watched_rollouts and watched_rollouts[-1] == TARGET - 1 and watched_rollouts == sorted(watched_rollouts)
    real_pods.figures.update(got["figures"])
    assert st["status"] == "SUCCEEDED", json.dumps(st)[-3000:]
    assert [a["attempt"] for a in st["attempts"]] == [1, 2], st["attempts"]
    a1, a2 = st["attempts"]
    assert a1["reason"] and a1["ended"] and a2["started"] and a2["resumed_from"]
    assert [j["submission_id"] for j in jobs] == [got["sid"], got["sid"] + "-a2"]
    _never_two_drivers(jobs)
    s1, s2 = _steps(logs[0]), _steps(logs[1])
    resumed = a2["resumed_iteration"]
    # Miles' numbering: checkpoint N is saved once rollout N is trained, when (N + 1) % K == 0; it resumes at N + 1
    assert resumed is not None and (resumed + 1) % K == 0 and 0 <= resumed <= max(s1), (resumed, s1)
    assert max(s1) - resumed < K  # the last complete checkpoint: fewer than K steps lost
    assert s2[0] == resumed + 1 and s2[-1] == TARGET - 1, s2  # resumed right after it, up to the target
    assert s1 == list(range(len(s1))) and s2 == list(range(resumed + 1, TARGET))
    assert sorted(set(s1) & set(s2)) == list(range(resumed + 1, max(s1) + 1))  # only steps past it trained twice
    # the supervisor pod: small, restricted, no API token, admitted in a namespace enforcing restricted
    pod = got["supervisor_pod"]
    [c] = pod.spec.containers
    assert c.resources.requests == {"cpu": "100m", "memory": "256Mi"}
    assert pod.spec.automount_service_account_token is False
    assert not [m for m in c.volume_mounts if "serviceaccount" in m.mount_path]
    real_pods.figures["supervisor_requests"] = c.resources.requests
    # status, logs and runs show both attempts
    code, out, _ = cluster.mr("logs", "workerloss")
    assert code == 0 and out.count("== attempt ") == 2 and "== attempt 2 " in out, out[-3000:]
    runs = _json(cluster.mr("runs", "-o", "json"))
    [row] = [r for r in (runs if isinstance(runs, list) else runs["runs"]) if r["run"] == "workerloss"]
    assert row["status"] == "SUCCEEDED"
    _kept_by_the_retention(cluster, "workerloss", resumed, real_pods)
    poll("both GPU workers back in Ray", lambda: _gpu_workers_in_ray(cluster) == 2, 300)


def _kept_by_the_retention(live: SimpleNamespace, run: str, loaded: int, real_pods: RealPods) -> None:
    """Issue 37's retention through a lost worker (:data:`RETENTION`: the newest 1 and the best by eval/score): on
    the claim at the end, exactly the newest, the best (:data:`BEST`) and the checkpoint attempt 2 loaded
    (``loaded``: never pruned, though neither); each other checkpoint deleted by ONE ``checkpoint_deleted`` event
    of the supervisor (its pod's log); ``runs outputs -o json`` lists what is on the claim, bytes as on the claim."""
    from miles_ray.core.supervision import parse_events

    record = json.loads((live.work / "state" / "runs" / f"{run}.json").read_text())
    root = record["checkpoint_dir"]
    claim = live.volume / Path(root).relative_to("/mnt/miles")
    written = [r for r in range(TARGET) if (r + 1) % K == 0 or r == TARGET - 1]  # Miles' saves: 2, 5, 8, 11
    kept = {TARGET - 1, BEST, loaded}
    on_claim = {int(p.name[5:]): p for p in claim.iterdir() if p.name.startswith("iter_")}
    assert sorted(on_claim) == sorted(kept), (sorted(on_claim), loaded)
    [sup] = _supervisor_pods(live, run)
    events = parse_events(live.core.read_namespaced_pod_log(sup.metadata.name, NS, container="supervisor",
                                                            _preload_content=False).data.decode())
    deleted = [e for e in events if e["event"] == "checkpoint_deleted"]
    assert sorted(e["iteration"] for e in deleted) == sorted(set(written) - kept), deleted  # one event each
    assert all(e["bytes"] > 0 and e["path"] == f"{root}/iter_{e['iteration']:07d}" for e in deleted), deleted
    t = time.monotonic()
    listed = _json(live.mr("runs", "outputs", run, "-o", "json"))
    real_pods.figures["runs_outputs_probe_s"] = round(time.monotonic() - t, 1)
    rows = {r["iteration"]: r for r in listed["checkpoints"]}
    assert listed["seen"]["live"] is True and sorted(rows) == written, listed
    for it, path in on_claim.items():
        on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        assert (rows[it]["state"], rows[it]["kept"], rows[it]["bytes"]) == ("complete", True, on_disk), rows[it]
    assert "attempt 2 loaded it" in rows[loaded]["why"] and "the best by eval/score" in rows[BEST]["why"], rows
    for it in set(written) - kept:
        assert (rows[it]["state"], rows[it]["kept"]) == ("deleted", False), rows[it]


def test_the_run_goes_on_when_the_submitting_cli_is_killed(cluster: SimpleNamespace) -> None:
    """``submit --follow`` SIGKILLed while it follows the run (it has printed a training step of the job's logs):
    the run's supervisor carries it to the end without it."""
    args = _submit_args("orphan", steps=2 * K)
    args.remove("--no-follow")
    proc = subprocess.Popen([sys.executable, "-m", "miles_ray", *args[:-2], "--follow"],
                            env={**cluster.env, "PYTHONUNBUFFERED": "1"}, cwd=cluster.work, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stdout), daemon=True)  # what the CLI printed
    reader.start()
    try:
        poll("the submitting CLI to follow the run's logs (a training step printed)",
             lambda: any(STEP_LINE.search(line) for line in list(said)) or proc.poll() is not None, 300)
        alive = proc.poll() is None  # still following: the kill below is what ends it
    finally:
        proc.kill()  # the terminal that submitted the run is gone
        code = proc.wait()
        reader.join(10)
    assert alive and code == -signal.SIGKILL, (f"the submitting CLI was not following the run when killed (exit "
                                               f"{code}); it printed:\n" + "".join(said)[-2000:])
    st = _until_final(cluster, "orphan")
    assert st["status"] == "SUCCEEDED" and len(st["attempts"]) == 1, json.dumps(st)[-3000:]
    assert _steps(_job_logs(cluster, st["attempts"][0]["submission_id"]))[-1] == 2 * K - 1


def test_a_bad_flag_fails_after_one_attempt_with_the_reason(cluster: SimpleNamespace) -> None:
    _submit(cluster, "badflag", extra_args=BAD_FLAG)
    st = _until_final(cluster, "badflag", 300)
    assert st["status"] == "FAILED", json.dumps(st)[-3000:]
    [a1] = st["attempts"]
    assert "before its first training step" in json.dumps(st), st  # never retried, and why
    assert f"unrecognized arguments: {BAD_FLAG}" in _job_logs(cluster, a1["submission_id"])
    assert len(_ray_jobs(cluster, "badflag")) == 1


def test_stop_while_the_supervisor_waits_for_workers_stays_stopped(cluster: SimpleNamespace) -> None:
    """A worker lost while the cluster cannot replace it (its group scaled to 1 underneath): the supervisor waits
    for the GPU workers; stop RUN -> STOPPED, the supervisor's pods gone, and once the worker is back nothing
    starts the run again."""
    first = _submit(cluster, "waiting", steps=10 * TARGET)  # long enough to outlast the lost worker's detection
    poll("attempt 1 to train past its first checkpoint",
         lambda: len(_steps(_job_logs(cluster, first["submission_id"]))) > K, 300)
    _set_workers(cluster, 1)  # KubeRay deletes one worker pod and does not replace it
    try:
        poll("the supervisor to wait for the workers", lambda: any(
            "waiting_for_workers" in ln for p in _supervisor_pods(cluster, "waiting")
            for ln in cluster.core.read_namespaced_pod_log(p.metadata.name, NS, _preload_content=False)
            .data.decode().splitlines()), 300)
        code, _, err = cluster.mr("stop", "waiting", "-y")
        assert code == 0, err[-2000:]
        assert not _supervisor_pods(cluster, "waiting")  # stop returned once its pods were gone
        assert _status(cluster, "waiting")["status"] == "STOPPED"
    finally:  # the worker comes back; the module's next tests need both workers, whatever happened above
        _set_workers(cluster, 2)
    poll("both GPU workers back in Ray", lambda: _gpu_workers_in_ray(cluster) == 2, 300)
    st = _status(cluster, "waiting")
    assert st["status"] == "STOPPED" and len(st["attempts"]) == 1, st
    assert len(_ray_jobs(cluster, "waiting")) == 1  # nothing submitted another attempt
    assert not _supervisor_pods(cluster, "waiting")


def _set_workers(live: SimpleNamespace, n: int) -> None:
    """Set the worker group's size on the RayCluster directly (the fault: not a miles-ray verb)."""
    ops = [{"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "gpu"}]
    for key in ("replicas", "minReplicas"):
        ops.append({"op": "replace", "path": f"/spec/workerGroupSpecs/0/{key}", "value": n})
    live.crd.patch_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", NAME, ops,
                                            _content_type="application/json-patch+json")


RUN2 = "twolost"  # not "budget": a name that says nothing about why the run ended


def test_the_restart_budget_spent_fails_listing_every_attempt(cluster: SimpleNamespace) -> None:
    """--max-restarts 1 and a worker lost in each attempt: attempt 2 is the last; FAILED, both listed, and the
    reason said is the budget's (read from the structured fields: the run's name says nothing about budgets)."""
    # 3 * TARGET steps: attempt 2 must still be training when its worker goes (it ends FAILED, not at the target)
    first = _submit(cluster, RUN2, steps=3 * TARGET, restarts=1)
    sid = first["submission_id"]
    poll("attempt 1 to train past its first checkpoint", lambda: len(_steps(_job_logs(cluster, sid))) > K + 1, 300)
    cluster.core.delete_namespaced_pod(_workers(cluster)[0].metadata.name, NS, grace_period_seconds=0)
    # attempt 2 makes progress beyond attempt 1 (else the supervisor stops for "no progress", not the budget)
    poll("attempt 1 to end", lambda: _status(cluster, RUN2)["attempts"][0].get("ended"), 300)
    last1 = max(_steps(_job_logs(cluster, sid)))
    poll(f"attempt 2 to train beyond step {last1}",
         lambda: max(_steps(_job_logs(cluster, f"{sid}-a2")) or [0]) > last1, 300)
    cluster.core.delete_namespaced_pod(_workers(cluster)[0].metadata.name, NS, grace_period_seconds=0)
    st = _until_final(cluster, RUN2)
    assert st["status"] == "FAILED", json.dumps(st)[-3000:]
    assert [a["attempt"] for a in st["attempts"]] == [1, 2]
    assert all(a["reason"] and a["ended"] for a in st["attempts"]), st["attempts"]
    a1, a2 = st["attempts"]
    assert a1["retry"] is True and "restart 1 of 1" in a1["why"], a1  # attempt 1 was worth a restart
    # the decision to stop is the budget's: the last attempt's own ``why`` and the run's message say so
    assert a2["retry"] is False and a2["why"].startswith("the restart budget is spent (--max-restarts 1, 2 "), a2
    assert "not retried: the restart budget is spent" in st["message"], st["message"]
    _never_two_drivers(_ray_jobs(cluster, RUN2))
    # the supervisor exited 0 once the run's end was decided: its container was never restarted to say it again
    # (a restart keeps one earlier log: attempt 1's events would have been lost)
    def ended_supervisor():
        [pod] = _supervisor_pods(cluster, RUN2)
        [c] = pod.status.container_statuses or [None]
        return c if c is not None and c.state.terminated is not None else None

    sup = poll("the supervisor's container to end", ended_supervisor, 120)
    assert sup.restart_count == 0 and sup.state.terminated.exit_code == 0, sup
    # what it wrote to /dev/termination-log is the pod's termination message (kubectl describe pod)
    said = sup.state.terminated.message or ""
    assert said.startswith(f"run {RUN2}: FAILED after 2 attempt(s): attempt 2: ") and \
        "not retried: the restart budget is spent (--max-restarts 1, 2 attempt(s))" in said, sup.state.terminated
    poll("both GPU workers back in Ray", lambda: _gpu_workers_in_ray(cluster) == 2, 300)


def _worker_containers(live: SimpleNamespace) -> dict[str, tuple[str, int]]:
    """Worker pod name -> (its Ray container's id, restartCount)."""
    out = {}
    for p in _workers(live):
        ray = next(c for c in p.status.container_statuses or [] if c.name == "ray")
        out[p.metadata.name] = (ray.container_id, ray.restart_count)
    return out


def _trained_steps(live: SimpleNamespace, run: str) -> list[list[int]]:
    """Every step the FAKE trainer trained for ``run``, per process in order (its ``.stand-in-steps`` file in the
    run's checkpoint dir on the shared volume: it outlives a head and its logs)."""
    record = json.loads((live.work / "state" / "runs" / f"{run}.json").read_text())
    path = live.volume / Path(record["checkpoint_dir"]).relative_to("/mnt/miles") / ".stand-in-steps"
    per: dict[str, list[int]] = {}
    for line in path.read_text().splitlines():
        pid, step = line.split()
        per.setdefault(pid, []).append(int(step))
    return list(per.values())


def head_loss(live: SimpleNamespace, run: str) -> dict:
    """The head pod deleted (grace 0) while the run trains on the GCS fault-tolerant cluster. Returns the figures
    and what the assertions need (shared with benchmarks/bench_supervised.py)."""
    poll("both GPU workers in Ray", lambda: _gpu_workers_in_ray(live) == 2, 300)
    first = _submit(live, run)
    sid = first["submission_id"]
    poll(f"attempt 1 to train past step {K + 1}", lambda: len(_steps(_job_logs(live, sid))) > K + 1, 300)
    before = _worker_containers(live)
    [head] = [p for p in live.core.list_namespaced_pod(
        NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items if p.metadata.deletion_timestamp is None]
    t = time.monotonic()
    live.core.delete_namespaced_pod(head.metadata.name, NS, grace_period_seconds=0)
    poll("attempt 2 to train its first step", lambda: _steps(_job_logs(live, f"{sid}-a2")), 300, interval=0.5,
         explain=lambda: f"status: {json.dumps(_status(live, run))[-3000:]}\nRay's jobs: {_head_api(live, '/api/jobs/')}")
    resumed_s = round(time.monotonic() - t, 1)
    st = _until_final(live, run)
    steps = _trained_steps(live, run)
    resumed = st["attempts"][1].get("resumed_iteration") if len(st["attempts"]) > 1 else None
    return {"status": st, "before": before, "after": _worker_containers(live), "steps": steps, "resumed": resumed,
            "figures": {"head_deleted_to_training_resumed_s": resumed_s,
                        "head_loss_steps_lost": max(steps[0]) - resumed if resumed is not None else None}}


def test_the_head_pod_lost_with_gcs_ft_resumes_and_keeps_the_workers(cluster: SimpleNamespace,
                                                                      real_pods: RealPods) -> None:
    """The head pod deleted (grace 0) mid-run on the GCS fault-tolerant cluster: the workers' Ray containers are
    not restarted; the job's driver (it ran on the head) is lost with it, and the supervisor (its pod reaches the
    new head by the head Service's name) starts attempt 2 from the last checkpoint: SUCCEEDED."""
    # beside the run, a job whose driver runs on a worker (the head has num-cpus 0: entrypoint_num_cpus puts it
    # there): with GCS fault tolerance it keeps running through the head's loss, with no restart
    stop_file = cluster.volume / "side-driver.stop"
    program = base64.b64encode(SIDE_DRIVER.format(stop=f"/mnt/miles/{stop_file.name}").encode()).decode()
    side = _head_api(cluster, "/api/jobs/", {"submission_id": "side-driver-on-worker", "entrypoint_num_cpus": 0.5,
                                             "entrypoint": f"python -c \"import base64; exec(base64.b64decode('{program}'))\""})
    assert side is not None, "the head's Jobs API did not take the side job"
    job = poll("the side job's driver to run on a worker", lambda: (j := _head_api(
        cluster, "/api/jobs/side-driver-on-worker")) and j["status"] == "RUNNING" and j.get("driver_node_id") and j, 120)
    assert not next(n for n in _ray_nodes(cluster) if n["node_id"] == job["driver_node_id"])["is_head_node"], job
    got = head_loss(cluster, "headloss")
    side_logs = _job_logs(cluster, "side-driver-on-worker")
    side_now = _head_api(cluster, "/api/jobs/side-driver-on-worker") or {}
    assert side_now.get("status") == "RUNNING", (side_now, side_logs[-2000:])  # it lived through the head's loss
    stop_file.touch()
    side_end = poll("the side job to end", lambda: (j := _head_api(cluster, "/api/jobs/side-driver-on-worker")) and j[
        "status"] in ("SUCCEEDED", "FAILED", "STOPPED") and j, 180)
    side_logs = _job_logs(cluster, "side-driver-on-worker")
    assert side_end["status"] == "SUCCEEDED", (side_end, side_logs[-3000:])
    ticks = [int(ln.split()[1]) for ln in side_logs.splitlines() if ln.startswith("TICK ")]
    assert ticks == list(range(len(ticks))) and "DRIVER_STARTED" in side_logs and side_logs.count("DRIVER_STARTED") == 1
    assert "TASK_RAN_ON " in side_logs  # Ray usable from that driver after the head's loss
    st = got["status"]
    real_pods.figures.update(got["figures"])
    assert st["status"] == "SUCCEEDED", json.dumps(st)[-3000:]
    assert [a["attempt"] for a in st["attempts"]] == [1, 2], st["attempts"]
    assert got["after"] == got["before"]  # same pods, same containers, restartCount unchanged
    s1, s2 = got["steps"]
    resumed = got["resumed"]
    assert resumed is not None and (resumed + 1) % K == 0 and max(s1) - resumed < K, (resumed, s1)
    assert s2 == list(range(resumed + 1, TARGET)), s2


def test_a_job_lost_with_its_head_is_failed_while_the_new_head_still_says_running(cluster: SimpleNamespace) -> None:
    """The stale case of a job lost with its head, on the GCS fault-tolerant cluster: an UNsupervised run
    (``--max-restarts 0``: nothing submits it again) whose driver ran in the head pod; the head pod deleted (grace
    0); the new head has Ray's job table back from Redis and still says the job is RUNNING. ``status RUN``, read
    while it says so (Ray's table read just before and just after), says FAILED: lost with the head pod it started
    on, naming that pod and the one serving now."""
    run = "stale"
    poll("both GPU workers in Ray", lambda: _gpu_workers_in_ray(cluster) == 2, 300)
    sid = _submit(cluster, run, steps=10 * TARGET, restarts=0)["submission_id"]
    poll("the run to train a step", lambda: _steps(_job_logs(cluster, sid)), 300)
    [head] = [p for p in cluster.core.list_namespaced_pod(
        NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items if p.metadata.deletion_timestamp is None]
    cluster.core.delete_namespaced_pod(head.metadata.name, NS, grace_period_seconds=0)

    def read_during_the_loss():
        before = _head_api(cluster, f"/api/jobs/{sid}")
        if before is None or (before.get("metadata") or {}).get("miles_ray_run") != run:
            return None  # no new head answering yet
        assert before["status"] == "RUNNING", f"the new head does not report the lost job RUNNING: {before}"
        st = _status(cluster, run)
        after = _head_api(cluster, f"/api/jobs/{sid}") or {}
        return (st, after) if after.get("status") == "RUNNING" else None

    st, ray_says = poll("a read of status RUN while the new head reports the lost job RUNNING", read_during_the_loss,
                        300, interval=1.0)
    assert ray_says["status"] == "RUNNING"  # the stale case itself: Ray's new head, not miles-ray, says RUNNING
    assert st["status"] == "FAILED", json.dumps(st)[-3000:]
    lost = st["head_lost"]
    assert lost["head"]["pod_uid"] == head.metadata.uid and lost["serving_head"]["pod_uid"] != head.metadata.uid, lost
    assert f"{NS}/{head.metadata.name}" in lost["reason"] and "is gone" in lost["reason"], lost
    poll("both GPU workers back in Ray", lambda: _gpu_workers_in_ray(cluster) == 2, 300)
