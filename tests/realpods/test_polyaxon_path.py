"""The Polyaxon path of miles-ray on real pods: a Polyaxon-made cluster runs Ray in real pods.

``miles-ray up --via polyaxon`` creates the operation on the real Polyaxon API server (haupt sandbox); the real
Polyaxon agent converts it into its ``polyaxon.com/v1 Cluster`` (Polyaxon's init containers, its
``polyaxon-sidecar``, ``restartPolicy: Never``, ``preStop: ray stop``, the token Secret by reference); the
stand-in for mloperator makes the RayCluster of it; the real KubeRay operator, kubelets and containerd run the
pods, with Polyaxon's own init and sidecar code in them (their image built locally from the ``polyaxon`` package
at the pinned version, under the names the converter uses). Shown, in this order, on ONE cluster:

1. before the admin's grant, ``up`` refuses in one line naming what the pods' service account may not do (what
   the sidecar needs), creating nothing; with it, ``up`` returns only once the head and both GPU workers are
   ALIVE in Ray (the Ray check on), and the pods are Polyaxon's (sidecar running, every container Ready);
2. the pods' logs read back through Polyaxon's API (the sidecars wrote them into the artifacts store);
3. the users' smoke sequence on it: check-data (missing paths named on every node, then all there), comm-check
   across the two worker pods, the rehearsal followed to SUCCEEDED, scale 1 -> 2, a worker pod deleted and
   replaced (Ray has both workers again), park (the Polyaxon run stopped, its pods gone) / resume (a new run
   from the same operation, both workers ALIVE in Ray again), down (run deleted, pods gone, claims kept);
4. (between the rehearsal and scale) two direct-mode runs side by side, each a Polyaxon run kept current by its
   supervisor pod (one's submitting CLI killed right after submit): status, inputs, logs, metrics, checkpoint
   lineage read back through Polyaxon's API, and ``runs compare`` agreeing with Polyaxon's metrics.

What is FAKE here, and why: mloperator's Cluster -> RayCluster step (tests/fakes/mloperator_standin.py: the
registry refuses its Go module; what it assumes is in its docstring), the GPUs (``nvidia.com/gpu`` in the node
status, Ray's ``num-gpus``) and Miles's ``train.py`` (tests/fakes/fake_train.py, not run by these steps).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import yaml

from tests.infra.fixtures import poll, ray_token_secret
from tests.infra.polyaxon_pods import PolyaxonPods, pstack, start_polyaxon_pods
from tests.infra.realpods import RealPods

pytestmark = pytest.mark.real_pods

REPO = Path(__file__).resolve().parents[2]
SEQUENCE = REPO / "scripts" / "smoke-sequence.sh"
NS = "miles-px"
NAME = "pxsmoke"
GPUS = 2
POLYAXON_VERSION = pstack.read_versions()["POLYAXON_VERSION"]


@pytest.fixture(scope="module")
def px(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolyaxonPods]:
    """The Polyaxon API server, the agent and the stand-in beside the tier's real-pod cluster (namespace miles-px
    with the claims miles-data and polyaxon-artifacts); the module's time goes into the tier's figures."""
    t = time.monotonic()
    p = start_polyaxon_pods(real_pods, tmp_path_factory.mktemp("pxpods"), NS)
    real_pods.figures["px_stack_start_s"] = round(time.monotonic() - t, 1)
    try:
        yield p
    finally:
        try:
            _remove_what_is_left(real_pods)
        finally:
            p.stop()
            real_pods.figures["px_module_s"] = round(time.monotonic() - t, 1)
        for k, v in p.figures.items():
            real_pods.figures[f"px_{k}"] = v


def _remove_what_is_left(real_pods: RealPods) -> None:
    """What a failed test left in the namespace (the agent's Cluster, the RayCluster, the runs' supervisor Jobs) is
    deleted and its pods awaited, so the next module finds the nodes' GPUs free."""
    from kubernetes import client

    api = real_pods.api_client()
    crd, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for group, plural in (("polyaxon.com", "clusters"), ("ray.io", "rayclusters")):
        for obj in crd.list_namespaced_custom_object(group, "v1", NS, plural)["items"]:
            crd.delete_namespaced_custom_object(group, "v1", NS, plural, obj["metadata"]["name"])
    batch = client.BatchV1Api(api)
    for job in batch.list_namespaced_job(NS).items:
        batch.delete_namespaced_job(job.metadata.name, NS, propagation_policy="Background")
    poll("the clusters' and the supervisors' pods to be gone", lambda: not core.list_namespaced_pod(
        NS, label_selector="ray.io/cluster").items and not core.list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/component=run-supervisor").items, 240)


@pytest.fixture(scope="module")
def env(real_pods: RealPods, px: PolyaxonPods, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The smoke sequence's own config (scripts/smoke-sequence.sh --print-config) for the Polyaxon path; ``mr``
    runs miles-ray against it as a user with a kubeconfig and POLYAXON_HOST would."""
    work = tmp_path_factory.mktemp("pxpath")
    seq_env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "SMOKE_NAMESPACE": NS, "SMOKE_NAME": NAME,
               "SMOKE_GPUS_PER_NODE": str(GPUS), "SMOKE_WORKER_MEMORY": "2Gi", "SMOKE_HEAD_MEMORY": "2Gi",
               "SMOKE_CPU_REQUEST": "250m"}
    cfg = yaml.safe_load(subprocess.run(["bash", str(SEQUENCE), "--print-config"], env=seq_env, capture_output=True,
                                        text=True, timeout=60, check=True).stdout)
    # the API as the pods reach it (a relay in the namespace): recorded with the cluster by up, where the runs'
    # supervisor pods report their Polyaxon runs
    cfg.update(image=real_pods.image, ray_version="2.60.0", polyaxon_project=px.project,
               polyaxon_host_in_cluster=px.host_for_pods)
    (work / "miles-ray.yaml").write_text(yaml.safe_dump(cfg))
    run_env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "MILES_RAY_CONFIG": str(work / "miles-ray.yaml"),
               "MILES_RAY_STATE_DIR": str(work / "state"), "POLYAXON_HOST": px.host,
               # what the agent knows, so an unknown connection is refused before anything is created
               "POLYAXON_AGENT_CONNECTIONS": json.dumps(pstack.DEFAULT_CONNECTIONS),
               "RAY_USAGE_STATS_ENABLED": "0"}
    run_env.pop("RAY_AUTH_MODE", None)

    def mr(*args: str, timeout: float = 900) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", *args], env=run_env, capture_output=True,
                              text=True, timeout=timeout, cwd=work)
        return proc.returncode, proc.stdout, proc.stderr

    from kubernetes import client

    api = real_pods.api_client()
    # the user's step of docs/security.md: the Ray token Secret the operation's pods read (named after --name)
    ray_token_secret(client.CoreV1Api(api), NS, NAME)
    return SimpleNamespace(mr=mr, run_env=run_env, work=work, api=api, core=client.CoreV1Api(api), crd=client.CustomObjectsApi(api),
                           px=px, rp=real_pods)


def _json(code_out_err: tuple[int, str, str], want: int = 0) -> dict:
    code, out, err = code_out_err
    assert code == want, f"exit {code} (want {want}): {err[-3000:]}\n{out[-3000:]}"
    return json.loads(out)


def _pods(env: SimpleNamespace, raycluster: str, role: str | None = None) -> list:
    sel = f"ray.io/cluster={raycluster}" + (f",ray.io/node-type={role}" if role else "")
    return [p for p in env.core.list_namespaced_pod(NS, label_selector=sel).items if p.metadata.deletion_timestamp is None]


def env_pods_all(env: SimpleNamespace, raycluster: str) -> list:
    """Every pod of the cluster, terminating ones included."""
    return env.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={raycluster}").items


def ray_alive(env: SimpleNamespace, raycluster: str) -> list[dict] | None:
    """Ray's ALIVE nodes as the head's own dashboard lists them, through a port-forward to the head pod with the
    token of the Secret the operation references (read here, not through any miles-ray verb)."""
    from miles_ray.adapters.kube import port_forward

    heads = [p for p in _pods(env, raycluster, "head") if p.status.phase == "Running"]
    if not heads:
        return None
    token = base64.b64decode(env.core.read_namespaced_secret(NAME, NS).data["auth_token"]).decode()
    try:
        with port_forward(env.api, NS, heads[0].metadata.name, 8265) as url:
            req = urllib.request.Request(url + "/api/v0/nodes?limit=1000", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                rows = json.loads(resp.read())["data"]["result"]["result"]
    except Exception:  # noqa: BLE001 -- a head that is starting or going away: not yet
        return None
    return [n for n in rows if n["state"] == "ALIVE"]


def ray_sees_the_pods(env: SimpleNamespace, raycluster: str) -> bool:
    """Ray's ALIVE nodes are exactly the cluster's running pods (head + 2 GPU workers), by IP."""
    pods = [p for p in _pods(env, raycluster) if p.status.phase == "Running" and p.status.pod_ip]
    alive = ray_alive(env, raycluster)
    return len(pods) == 3 and alive is not None and sorted(n["node_ip"] for n in alive) == sorted(
        p.status.pod_ip for p in pods)


# ---- 1. up ----------------------------------------------------------------------------------------------------

def test_up_refuses_until_the_pods_service_account_may_what_the_sidecar_needs(env: SimpleNamespace) -> None:
    """No grant yet: one error line naming what the sidecar needs and the commands that grant it; nothing created
    in Polyaxon, in Kubernetes or in the state dir. (The admin then grants it, as docs/walkthrough.md says.)"""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    code, out, err = env.mr("up", "--via", "polyaxon", "--nodes", "2", "--timeout", "600", "-o", "json")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert f"service account {NS}/default may not get, list, watch pods, pods/status, pods/log, services, events" \
        in lines[0], lines[0]
    assert f"kubectl -n {NS} create rolebinding polyaxon-runs --role=polyaxon-runs --serviceaccount={NS}:default" \
        in err, err
    assert "Traceback" not in err
    assert PolyaxonApi(host=env.px.host).runs_named(env.px.owner, env.px.project, NAME) == []
    assert not env.crd.list_namespaced_custom_object("polyaxon.com", "v1", NS, "clusters")["items"]
    assert not list((env.work / "state").rglob(f"{NAME}.json"))
    env.px.grant_pods_rbac()


@pytest.fixture(scope="module")
def live(env: SimpleNamespace) -> SimpleNamespace:
    """``up --via polyaxon --nodes 2`` (Ray check on), after the grant of the test above."""
    t = time.monotonic()
    up = _json(env.mr("up", "--via", "polyaxon", "--nodes", "2", "--timeout", "600", "-o", "json"))
    env.rp.figures["px_up_to_workers_in_ray_s"] = round(time.monotonic() - t, 1)
    env.up = up
    env.raycluster = up["raycluster"]
    env.uuid = up["polyaxon_uuid"]
    env.address = f"k8s://{NS}/{env.raycluster}"
    return env


def test_up_returns_with_head_and_both_gpu_workers_in_ray(live: SimpleNamespace) -> None:
    up = live.up
    assert up["created"] is True and up["via"] == "polyaxon" and up["raycluster"] == f"plx-operation-{live.uuid}"
    assert up["status"]["ray"]["gpu_node_count"] == 2 and up["status"]["ready_workers"] == 2
    alive = ray_alive(live, live.raycluster)  # Ray's own node list, not miles-ray's reading of it
    assert alive is not None and len(alive) == 3, alive
    assert sum(n["resources_total"].get("GPU", 0) for n in alive) == 2 * GPUS, alive
    # the chain: Polyaxon's run -> the agent's Cluster -> (stand-in) the RayCluster it owns
    from miles_ray.adapters.polyaxon_api import FINAL_STATUSES, PolyaxonApi

    run = PolyaxonApi(host=live.px.host).get_run(live.px.owner, live.px.project, live.uuid, with_conditions=False)
    assert run["status"] not in FINAL_STATUSES and run["status"] != "created", run["status"]
    [cr] = live.crd.list_namespaced_custom_object("polyaxon.com", "v1", NS, "clusters")["items"]
    assert cr["metadata"]["name"] == live.raycluster
    [rc] = live.crd.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]
    assert rc["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]


def test_the_pods_are_polyaxons_and_every_container_is_ready(live: SimpleNamespace) -> None:
    """What Polyaxon's converter put in the pods runs: its init container completed, its sidecar (its image built
    from the pinned package) running and Ready beside Ray, restartPolicy Never on every pod, preStop on workers."""
    pods = _pods(live, live.raycluster)
    assert len(pods) == 3
    for p in pods:
        assert p.spec.restart_policy == "Never", p.metadata.name
        images = {c.name: c.image for c in p.spec.containers}
        assert images["polyaxon-sidecar"] == f"polyaxon/polyaxon-sidecar:{POLYAXON_VERSION}", images
        assert any(c.image == f"polyaxon/polyaxon-init:{POLYAXON_VERSION}" for c in p.spec.init_containers or []), \
            [c.image for c in p.spec.init_containers or []]
        statuses = {c.name: c for c in p.status.container_statuses}
        assert all(c.ready for c in statuses.values()), {n: c.state for n, c in statuses.items()}
        assert statuses["polyaxon-sidecar"].state.running is not None, statuses["polyaxon-sidecar"].state
        assert all(c.state.terminated and c.state.terminated.exit_code == 0
                   for c in p.status.init_container_statuses or []), p.status.init_container_statuses
        if p.metadata.labels["ray.io/node-type"] == "worker":
            main = next(c for c in p.spec.containers if c.name != "polyaxon-sidecar")
            assert main.lifecycle.pre_stop._exec.command[-1] == "ray stop"


def test_the_polyaxon_api_answers_inside_the_pods(live: SimpleNamespace) -> None:
    """What runs on the cluster reaches Polyaxon's API at ``host_for_pods`` (a relay in the cluster's namespace to
    the server on the machine), and the Kubernetes API at its in-cluster address: asked from a worker pod."""
    from kubernetes.stream import stream

    worker = _pods(live, live.raycluster, "worker")[0]

    def run(*cmd: str) -> str:
        return stream(live.core.connect_get_namespaced_pod_exec, worker.metadata.name, NS, container="polyaxon-main",
                      command=list(cmd), stderr=True, stdin=False, stdout=True, tty=False)

    answer = run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                 f"{live.px.host_for_pods}/api/v1/{live.px.owner}/{live.px.project}/runs/{live.uuid}")
    assert answer.strip() == "200", answer
    answer = run("sh", "-c", "curl -sS -o /dev/null -w '%{http_code}' --cacert "
                 "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt -H \"Authorization: Bearer $(cat "
                 "/var/run/secrets/kubernetes.io/serviceaccount/token)\" "
                 "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/" + NS + "/pods")
    assert answer.strip() == "200", answer  # the grant of the first test, through 10.96.0.1:443


def test_the_pods_logs_are_read_through_polyaxons_api(live: SimpleNamespace) -> None:
    """The sidecars read the Ray containers' logs through the in-cluster API and write them into the artifacts
    store, the very directory the API server serves a run's logs from: read back through the API."""
    t = time.monotonic()
    pods = {p.metadata.name for p in _pods(live, live.raycluster)}

    def logs() -> list[dict] | None:
        got = live.px.run_logs(live.uuid)
        return got if pods <= {ln.get("pod") for ln in got} else None

    got = poll("Polyaxon's API to serve the logs of every pod of the run", logs, 180)
    live.rp.figures["px_logs_in_polyaxon_s"] = round(time.monotonic() - t, 1)
    for pod in pods:  # the Ray container's own output, per pod
        mine = [ln for ln in got if ln.get("pod") == pod and ln.get("container") == "polyaxon-main"]
        assert mine, (pod, got[-5:])
    text = "\n".join(str(ln.get("value", "")) for ln in got)
    assert "Ray runtime started" in text, text[-2000:]
    assert {f"{p}.jsonl" for p in pods} <= {f.name for f in (live.px.artifacts / live.uuid / "plxlogs").iterdir()}


# ---- 2. the users' smoke sequence on the Polyaxon-made cluster -------------------------------------------------

def test_check_data_then_comm_check(live: SimpleNamespace) -> None:
    rep = _json(live.mr("check-data", "--address", live.address, "-o", "json"), want=4)
    assert sorted(n["role"] for n in rep["nodes"]) == ["gpu worker", "gpu worker", "head"], rep["nodes"]
    wanted = {m["path"] for n in rep["nodes"] for m in n["missing"]}
    assert wanted and all(p.startswith("/mnt/miles/") for p in wanted), wanted
    for p in wanted:  # create what was named, through the claim's directory on this machine
        local = live.px.data / Path(p).relative_to("/mnt/miles")
        if local.suffix in (".jsonl", ".json", ".parquet", ".txt"):
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text("{}\n")
        else:
            local.mkdir(parents=True, exist_ok=True)
    rep = _json(live.mr("check-data", "--address", live.address, "-o", "json"))
    assert rep["ok"] is True and rep["missing"] == []
    t = time.monotonic()
    rep = _json(live.mr("comm-check", "--address", live.address, "--size-mb", "4", "-o", "json"))
    live.rp.figures["px_comm_check_s"] = round(time.monotonic() - t, 1)
    assert rep["ok"] is True, rep
    workers = {p.status.pod_ip for p in _pods(live, live.raycluster, "worker")}
    assert {n["ip"] for n in rep["nodes"]} == workers, rep["nodes"]


def test_rehearsal_follows_to_succeeded(live: SimpleNamespace) -> None:
    t = time.monotonic()
    code, out, err = live.mr("submit", "--rehearse", "--nodes", "2", "--run", "px-rehearsal", "--timeout", "600",
                             "--follow")
    live.rp.figures["px_rehearsal_s"] = round(time.monotonic() - t, 1)
    if code != 0:
        pytest.fail("\n".join([err[-3000:], live.mr("status", "px-rehearsal", "-o", "json")[1][-3000:],
                               *live.mr("logs", "px-rehearsal")[1:], *_supervisor_logs(live, "px-rehearsal")]))
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("REHEARSAL_RESULT ")][-1].split(" ", 1)[1])
    assert result["ok"] is True and result["errors"] == []
    assert len(result["nodes"]) == 2 and all(n["gpus"] == GPUS for n in result["nodes"]), result["nodes"]
    st = _json(live.mr("status", "px-rehearsal", "-o", "json"))
    assert st["status"] == "SUCCEEDED"


# ---- 3. a direct-mode Miles run is a Polyaxon run, kept current from the cluster ----------------------------

ROLLOUTS = 20  # of 0.3 s each (the FAKE trainer); the recipe's --save-interval 20: one checkpoint, at the end
KINDS = {"step": "train/loss", "rollout": "rollout/raw_reward", "eval": "eval/aime", "perf": "perf/rollout_time"}


def _direct_args(run: str, eval_final: str) -> list[str]:
    return ["submit", "--mode", "direct", "--nodes", "2", "--run", run, "--no-check-data", "--num-rollout",
            str(ROLLOUTS), "--miles-commit", "abc123", "--allow-miles-drift",
            "--no-memory-check",  # a STAND-IN trainer in 2Gi pods, not Qwen3-4B
            "--dataset-revision", "d1", "--model-revision", "m1", "--env", "MILESRAY_TEST_FAKE_ROLLOUT_SECONDS=0.3",
            "--env", f"MILESRAY_TEST_FAKE_EVAL_FINAL={eval_final}", "-o", "json"]


@pytest.fixture(scope="module")
def miles(live: SimpleNamespace) -> SimpleNamespace:
    """The FAKE metrics trainer (tests/fakes/fake_metrics_train.py: Miles-shaped metric lines, Megatron-shaped
    checkpoint dirs; Miles needs GPUs and its image) as ``miles_root``/train.py on the shared claim; ``mr`` runs
    miles-ray with that miles_root."""
    live.px.data.chmod(0o777)  # the run's output and checkpoint dirs are written by the pods' uid
    root = live.px.data / "fake-miles"
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", root / "train.py")
    menv = {**live.run_env, "MILES_RAY_MILES_ROOT": "/mnt/miles/fake-miles"}

    def mr(*args: str, timeout: float = 600) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", *args], env=menv, capture_output=True,
                              text=True, timeout=timeout, cwd=live.work)
        return proc.returncode, proc.stdout, proc.stderr

    return SimpleNamespace(mr=mr, env=menv, live=live)


def _record(live: SimpleNamespace, run: str) -> dict:
    path = live.work / "state" / "runs" / f"{run}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _check_polyaxon_run(miles: SimpleNamespace, run: str, eval_final: float) -> None:
    """The run's Polyaxon run, read back through Polyaxon's API: SUCCEEDED, non-managed, its inputs, its logs, a
    metric of each kind with the values the trainer printed (read from the Ray job's logs), its checkpoints."""
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns
    from miles_ray.core.metrics import parse_metrics

    live = miles.live
    rec = _record(live, run)
    uuid = rec["polyaxon_run_uuid"]
    assert (rec["polyaxon_project"], rec["polyaxon_host"]) == (live.px.project, live.px.host)
    runs = TrackedRuns(PolyaxonApi(host=live.px.host), live.px.owner, live.px.project)
    px = poll(f"Polyaxon run {uuid} of {run} to end", lambda: (r := runs.run(uuid))["status"] in (
        "succeeded", "failed", "stopped") and r, 300, interval=2,
        explain=lambda: json.dumps(runs.run(uuid))[-2000:] + "\n" + "\n".join(_supervisor_logs(live, run)))
    assert px["status"] == "succeeded", px
    assert px["is_managed"] is False and px["name"] == run
    inputs = px["inputs"]
    assert inputs["command"] == rec["entrypoint"] and "/mnt/miles/fake-miles/train.py" in inputs["command"]
    assert (inputs["miles_commit"], inputs["model_revision"], inputs["dataset_revision"]) == ("abc123", "m1", "d1")
    assert (inputs["recipe"], inputs["recipe_hash"], inputs["split"]) == (rec["recipe"], rec["recipe_hash"],
                                                                          rec["split"])
    logs = runs.logs(uuid)
    assert any(line.startswith("STAND-IN train.py") for line in logs), logs[:5]
    assert any(f"step {ROLLOUTS - 1}: " in line for line in logs), logs[-5:]
    code, out, err = miles.mr("logs", run)
    assert code == 0, err[-2000:]
    on_claim = live.px.data / Path(rec["checkpoint_dir"]).relative_to("/mnt/miles")
    stated = _stated_metrics(on_claim)  # the values the STAND-IN trainer says it printed, not a parse of its logs
    assert stated["eval/aime"][-1][1] == eval_final  # the final score the test asked the trainer for
    got = runs.metrics(uuid, list(KINDS.values()))
    parsed = parse_metrics(out)["metrics"]  # miles-ray's own reading of the logs
    for kind, name in KINDS.items():
        assert sorted(got[name]) == sorted(stated[name]), (name, got[name], stated[name])  # each point, once
        assert parsed[name]["kind"] == kind and parsed[name]["count"] == len(stated[name]), (name, parsed[name])
        assert (parsed[name]["id"], parsed[name]["value"]) == stated[name][-1], (name, parsed[name])
    lineage = {a["name"]: a for a in runs.lineage(uuid)}
    ckpt = lineage["checkpoints"]
    assert ckpt["kind"] == "dir" and ckpt["is_input"] is False
    assert ckpt["summary"]["checkpoint_dir"] == rec["checkpoint_dir"]
    # Miles' numbering: the one checkpoint is saved after the last rollout, ROLLOUTS - 1
    assert ckpt["summary"]["latest_iteration"] == str(ROLLOUTS - 1)
    assert (on_claim / "latest_checkpointed_iteration.txt").read_text() == str(ROLLOUTS - 1)
    assert (on_claim / f"iter_{ROLLOUTS - 1:07d}").is_dir()


def _stated_metrics(checkpoint_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``.stand-in-metrics`` (tests/fakes/fake_metrics_train.py: every value it printed, as it printed it): per
    metric, its ``(rollout id, value)`` points in order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (checkpoint_dir / ".stand-in-metrics").read_text().splitlines():
        name, rid, value = line.split()
        out.setdefault(name, []).append((int(rid), float(value)))
    return out


def _supervisor_logs(live: SimpleNamespace, run: str) -> list[str]:
    out = []
    for p in live.core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=run-supervisor").items:
        try:
            out.append(live.core.read_namespaced_pod_log(p.metadata.name, NS)[-3000:])
        except Exception as e:  # noqa: BLE001 -- a diagnostic only
            out.append(f"{p.metadata.name}: {e}")
    return out


def test_direct_runs_are_polyaxon_runs_kept_current_from_their_supervisor_pods(miles: SimpleNamespace) -> None:
    """Two ``submit --mode direct`` runs of the FAKE trainer, side by side: each one's supervisor is a Job in
    Polyaxon's sidecar image, reporting to Polyaxon's API at polyaxon_host_in_cluster (the up's record of it). The
    second's submitting CLI is SIGKILLed as soon as its run is recorded with its supervisor started: its supervisor
    pod carries the run and its Polyaxon run to the end without it."""
    t = time.monotonic()
    sub = _json(miles.mr(*_direct_args("px-direct-a", "0.3")))
    assert sub["created"] is True, sub
    proc = subprocess.Popen([sys.executable, "-m", "miles_ray", *_direct_args("px-direct-b", "0.45"), "--follow"],
                            env=miles.env, cwd=miles.live.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        poll("the run recorded with its supervisor started", lambda: proc.poll() is None and bool(
            _record(miles.live, "px-direct-b").get("supervisor", {}).get("where")) or proc.poll() is not None, 300,
            interval=0.2)
        assert proc.poll() is None, f"submit ended (exit {proc.returncode}) before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _check_polyaxon_run(miles, "px-direct-a", 0.3)
    miles.live.rp.figures["px_direct_run_to_polyaxon_succeeded_s"] = round(time.monotonic() - t, 1)
    _check_polyaxon_run(miles, "px-direct-b", 0.45)
    from kubernetes import client

    jobs = {j.metadata.name: j for j in client.BatchV1Api(miles.live.api).list_namespaced_job(NS).items}
    for run in ("px-direct-a", "px-direct-b"):
        image = jobs[f"{run}-supervisor"].spec.template.spec.containers[0].image
        assert image == f"polyaxon/polyaxon-sidecar:{POLYAXON_VERSION}", (run, image)
    # miles-ray's comparison and Polyaxon's metrics agree on the final values
    from miles_ray.adapters.polyaxon_api import PolyaxonApi
    from miles_ray.adapters.polyaxon_api.tracked import TrackedRuns

    rows = {m["metric"]: m for m in _json(miles.mr("runs", "compare", "px-direct-a", "px-direct-b", "-o", "json"))[
        "metrics"]}
    assert (rows["eval/aime"]["a"], rows["eval/aime"]["b"]) == (0.3, 0.45), rows["eval/aime"]
    runs = TrackedRuns(PolyaxonApi(host=miles.live.px.host), miles.live.px.owner, miles.live.px.project)
    for side, run in (("a", "px-direct-a"), ("b", "px-direct-b")):
        got = runs.metrics(_record(miles.live, run)["polyaxon_run_uuid"], sorted(rows))
        for name, row in rows.items():
            assert got[name][-1] == (row[f"{side}_at"], row[side]), (run, name, got[name][-1], row)


def test_scale_1_then_2(live: SimpleNamespace) -> None:
    scaled = _json(live.mr("scale", "--nodes", "1", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    assert scaled["from"] == 2 and scaled["to"] == 1 and scaled["ready_workers"] == 1
    scaled = _json(live.mr("scale", "--nodes", "2", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    assert scaled["to"] == 2 and scaled["ready_workers"] == 2
    poll("Ray to see the head and both GPU worker pods of now", lambda: ray_sees_the_pods(live, live.raycluster), 300)


def test_a_deleted_worker_pod_is_replaced_and_rejoins_ray(live: SimpleNamespace) -> None:
    """restartPolicy Never (Polyaxon's): KubeRay replaces the pod; the new one, sidecar and all, joins Ray."""
    victim = _pods(live, live.raycluster, "worker")[0]
    t = time.monotonic()
    live.core.delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)
    poll("a new worker pod and Ray to see the head and both GPU worker pods of now",
         lambda: victim.metadata.name not in {p.metadata.name for p in _pods(live, live.raycluster)}
         and ray_sees_the_pods(live, live.raycluster), 300)
    live.rp.figures["px_worker_deleted_to_replacement_in_ray_s"] = round(time.monotonic() - t, 1)
    # and the new pod turns Ready as a whole (Ray's probe and Polyaxon's sidecar), so KubeRay counts it again
    poll("every container of every pod of the cluster to be Ready", lambda: all(
        p.status.container_statuses and all(c.ready for c in p.status.container_statuses)
        for p in _pods(live, live.raycluster)), 180)
    st = _json(live.mr("status", "--backend", "kubernetes", "-o", "json"))
    assert st["ready_workers"] == 2, st


def test_park_then_resume_brings_both_workers_back_into_ray(live: SimpleNamespace) -> None:
    from miles_ray.adapters.polyaxon_api import FINAL_STATUSES, PolyaxonApi

    parked = _json(live.mr("park", "-y", "--backend", "kubernetes", "--timeout", "300", "-o", "json"))
    assert parked["parked"] is True and parked["stopped_uuid"] == live.uuid
    api = PolyaxonApi(host=live.px.host)
    poll("Polyaxon to stop the run", lambda: api.get_run(live.px.owner, live.px.project, live.uuid,
                                                         with_conditions=False)["status"] in FINAL_STATUSES, 180)
    # park returned once the run's pods were gone, terminating ones included (they hold their CPUs and GPUs)
    assert not env_pods_all(live, live.raycluster)
    # the workers' Ray stopped (preStop: ray stop) and only Polyaxon's sidecar was left: miles-ray deleted them at once
    assert len(parked["grace_cut"]) >= 2, parked
    t = time.monotonic()
    back = _json(live.mr("resume", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    live.rp.figures["px_resume_to_workers_in_ray_s"] = round(time.monotonic() - t, 1)
    assert back["resumed"] is True and back["resumed_from"] == live.uuid and back["polyaxon_uuid"] != live.uuid
    assert back["status"]["ray"]["gpu_node_count"] == 2
    live.uuid, live.raycluster = back["polyaxon_uuid"], back["raycluster"]
    live.address = f"k8s://{NS}/{live.raycluster}"
    alive = ray_alive(live, live.raycluster)
    assert alive is not None and len(alive) == 3, alive


def test_down_deletes_the_run_and_its_pods_and_keeps_the_claims(live: SimpleNamespace) -> None:
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    t = time.monotonic()
    res = _json(live.mr("down", "-y", "--backend", "kubernetes", "-o", "json"))
    live.rp.figures["px_down_s"] = round(time.monotonic() - t, 1)
    assert res["polyaxon_deleted"] == live.uuid
    # down waited for them (120 s at most: then it says how many were left)
    assert not res.get("pods_remaining"), res
    assert len(res["grace_cut"]) >= 2, res  # as for park
    assert not res.get("notices"), res  # the agent removed the cluster of the stopped run (not miles-ray's fallback)
    poll("the pods to be gone", lambda: not env_pods_all(live, live.raycluster), 60)
    assert not live.crd.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]
    runs = PolyaxonApi(host=live.px.host).runs_named(live.px.owner, live.px.project, NAME)
    assert live.uuid not in {r["uuid"] for r in runs if not r.get("deleting")}
    for claim in ("miles-data", "polyaxon-artifacts"):
        assert live.core.read_namespaced_persistent_volume_claim(claim, NS).status.phase == "Bound"
