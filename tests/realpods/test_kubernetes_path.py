"""The whole Kubernetes path of miles-ray on real pods: Ray really runs in KubeRay's pods on real kubelets.

1. The users' smoke sequence, ``scripts/smoke-sequence.sh`` — the very script the kind workflow runs in
   users' CI — on this tier's cluster (tests/infra/realpods.py): up (Ray check on) -> status -> submit
   --rehearse through the ``k8s://`` port-forward -> logs -> scale 1 -> scale 2 -> down.
2. Then, on a cluster brought up again under the ``restricted`` Pod Security Standard (the namespace enforces it,
   the config says ``pod_security: restricted``): the pods' security contexts, the RayCluster equal to
   ``render -F kuberay``'s, the pods' one resolver, check-data on the head and both worker pods (missing paths named per
   node, then all present), comm-check across the two worker pods, doctor clean, a job running on the head ->
   scale refused -> stop -> scale allowed, the head pod deleted under ``logs -f`` (one clear line, KubeRay
   recreates it, status says so), park (pods gone, claim kept) and resume (both workers ALIVE in Ray again),
   doctor naming an image drift, down (claim kept).

What is fake here, and why: the GPUs (``nvidia.com/gpu`` in the node status, Ray's ``num-gpus``: no GPU
on this machine) and Miles's ``train.py`` (tests/fakes/fake_train.py, named as such, placed on the shared
volume as ``miles_root``: real training needs GPUs and Miles' image).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import yaml

from tests.infra.fixtures import http_status, poll
from tests.infra.realpods import RealPods, realnodes

pytestmark = pytest.mark.real_pods

REPO = Path(__file__).resolve().parents[2]
SEQUENCE = REPO / "scripts" / "smoke-sequence.sh"
NS = "miles-smoke"
NAME = "smoke"
GPUS = 2
ADDRESS = f"k8s://{NS}/{NAME}"


@contextlib.contextmanager
def _logs_follow(live: SimpleNamespace, run: str) -> Iterator[SimpleNamespace]:
    """``miles-ray logs RUN -f`` in the background: its stdout lines collect in ``.lines`` as they come;
    ``.finish(timeout)`` waits for it to end and returns its stderr; killed on exit if still running."""
    proc = subprocess.Popen([sys.executable, "-m", "miles_ray", "logs", run, "-f"], env=live.env, cwd=live.work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    def finish(timeout: float) -> str:
        proc.wait(timeout=timeout)
        reader.join(timeout=30)
        return proc.stderr.read()

    try:
        yield SimpleNamespace(proc=proc, lines=lines, finish=finish)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _sequence_env(rp: RealPods, workdir: Path) -> dict[str, str]:
    """What the real-pod cluster hands the smoke sequence (kind-smoke.sh hands it the kind cluster's)."""
    return {**os.environ,
            "KUBECONFIG": str(rp.kubeconfig), "SMOKE_IMAGE": rp.image, "SMOKE_NAMESPACE": NS, "SMOKE_NAME": NAME,
            "SMOKE_GPUS_PER_NODE": str(GPUS), "SMOKE_WORKER_MEMORY": "2Gi", "SMOKE_HEAD_MEMORY": "2Gi",
            # each real node has this machine's 2 CPUs; a worker's Ray num-cpus (and CPU limit) stays 3
            "SMOKE_CPU_REQUEST": "250m",
            "SMOKE_HEAD_NODE": rp.cpu_nodes[0], "SMOKE_GPU_NODES": " ".join(rp.gpu_nodes),
            "SMOKE_MILES_RAY": f"{sys.executable} -m miles_ray", "SMOKE_WORKDIR": str(workdir),
            "SMOKE_UP_TIMEOUT": "600"}


@pytest.fixture(scope="module")
def ns(real_pods: RealPods) -> SimpleNamespace:
    """Namespace miles-smoke with the claim miles-data (one directory of this machine on every node)."""
    from kubernetes import client

    api = real_pods.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    poll(f"ServiceAccount {NS}/default",
          lambda: any(s.metadata.name == "default" for s in core.list_namespaced_service_account(NS).items), 60)
    volume = real_pods.shared_volume(NS, "miles-data")
    return SimpleNamespace(api=api, core=core, crd=client.CustomObjectsApi(api), volume=volume)


def _rayclusters(ns: SimpleNamespace) -> list[dict]:
    return ns.crd.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]


def _head_api(live: SimpleNamespace, path: str) -> tuple[str, dict | list] | None:
    """(the running head pod's UID, the JSON its dashboard answers ``GET path`` with), through a port-forward to
    the pod with the token of KubeRay's Secret: read here, not through any miles-ray verb. None while there is no
    running head or it does not answer."""
    import base64
    import urllib.request

    from miles_ray.adapters.kube import port_forward

    heads = [p for p in live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items
             if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    if not heads:
        return None
    token = base64.b64decode(live.core.read_namespaced_secret(NAME, NS).data["auth_token"]).decode()
    try:
        with port_forward(live.api, NS, heads[0].metadata.name, 8265) as url:
            req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return heads[0].metadata.uid, json.loads(resp.read())
    except Exception:  # noqa: BLE001 -- a head that is starting or going away: not yet
        return None


def ray_alive_nodes(live: SimpleNamespace) -> list[dict] | None:
    """Ray's ALIVE nodes as the head's own dashboard lists them (GET /api/v0/nodes, read by :func:`_head_api`, not
    through any miles-ray verb). None while there is no running head or it does not answer."""
    answer = _head_api(live, "/api/v0/nodes?limit=1000")
    if answer is None:
        return None
    rows = answer[1]["data"]["result"]["result"]
    return [n for n in rows if n["state"] == "ALIVE"]


def _ray_sees_the_pods(live: SimpleNamespace) -> bool:
    """Ray's ALIVE nodes are exactly the cluster's running pods (head + 2 GPU workers) -- not a count: a pod
    deleted a moment ago stays ALIVE in Ray until its health check fails, and would stand in for its
    replacement that has not joined yet."""
    pods = [p for p in live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.status.pod_ip]
    alive = ray_alive_nodes(live)
    return len(pods) == 3 and alive is not None and sorted(n["node_ip"] for n in alive) == sorted(
        p.status.pod_ip for p in pods)


def _step_seconds(stderr: str) -> dict[str, float]:
    """Seconds per step of the sequence, from its '== step' log lines (HH:MM:SS stamps)."""
    marks = []
    for line in stderr.splitlines():
        parts = line.split(" smoke: ", 1)
        if len(parts) == 2 and (parts[1].startswith("== ") or parts[1] == "PASSED"):
            h, m, s = (int(x) for x in parts[0][-8:].split(":"))
            marks.append((parts[1][3:] if parts[1].startswith("== ") else "end", h * 3600 + m * 60 + s))
    return {name: (marks[i + 1][1] - t) % 86400 for i, (name, t) in enumerate(marks[:-1])}


def test_the_users_smoke_sequence_passes_on_real_pods(real_pods: RealPods, ns: SimpleNamespace, tmp_path: Path) -> None:
    t = time.monotonic()
    proc = subprocess.run(["bash", str(SEQUENCE)], env=_sequence_env(real_pods, tmp_path / "sequence"),
                          capture_output=True, text=True, timeout=2400)
    real_pods.figures["smoke_sequence_s"] = round(time.monotonic() - t, 1)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stderr.rstrip().endswith("smoke: PASSED"), proc.stderr[-2000:]
    real_pods.figures["smoke_sequence_steps_s"] = _step_seconds(proc.stderr)
    up = json.loads((tmp_path / "sequence" / "up.json").read_text())
    assert up["status"]["ray"]["gpu_node_count"] == 2  # `up` returned only once both workers were ALIVE in Ray
    assert not _rayclusters(ns)  # down deleted the cluster ...
    assert ns.core.read_namespaced_persistent_volume_claim("miles-data", NS).status.phase == "Bound"  # ... not the claim


# ---- the rest of the path, on a cluster brought up again -----------------------------------------

@pytest.fixture(scope="module")
def live(real_pods: RealPods, ns: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """``up --via kuberay --nodes 2`` with the sequence's own config, plus a FAKE Miles (tests/fakes/fake_train.py)
    on the shared volume as miles_root; ``mr(*args)`` runs miles-ray against it."""
    work = tmp_path_factory.mktemp("kpath")
    env = _sequence_env(real_pods, work)
    config = subprocess.run(["bash", str(SEQUENCE), "--print-config"], env=env, capture_output=True, text=True,
                            timeout=60, check=True).stdout
    (ns.volume / "fake-miles").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_train.py", ns.volume / "fake-miles" / "train.py")
    cfg = yaml.safe_load(config)
    cfg.update(miles_root="/mnt/miles/fake-miles", image=real_pods.image, ray_version="2.60.0")
    (work / "miles-ray.yaml").write_text(yaml.safe_dump(cfg))
    run_env = {**os.environ, "KUBECONFIG": str(real_pods.kubeconfig), "MILES_RAY_CONFIG": str(work / "miles-ray.yaml"),
               "MILES_RAY_STATE_DIR": str(work / "state"), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

    def mr(*args: str, timeout: float = 900) -> tuple[int, str, str]:
        proc = subprocess.run([sys.executable, "-m", "miles_ray", *args], env=run_env, capture_output=True,
                              text=True, timeout=timeout, cwd=work)
        return proc.returncode, proc.stdout, proc.stderr

    # From here on the namespace enforces the restricted Pod Security Standard (the smoke sequence ran under
    # baseline): every test below runs Ray, jobs and probes in pods the API server admitted as restricted.
    ns.core.patch_namespace(NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                                         "pod-security.kubernetes.io/enforce-version": "latest"}}})
    ns.volume.chmod(0o777)  # the shared volume is writable by the non-root uid (a real RWX class would use fsGroup)
    cfg["pod_security"] = "restricted"
    (work / "miles-ray.yaml").write_text(yaml.safe_dump(cfg))
    t = time.monotonic()
    code, out, err = mr("up", "--via", "kuberay", "--nodes", "2", "--timeout", "600", "-o", "json")
    assert code == 0, err[-4000:]
    real_pods.figures["up_to_workers_in_ray_s"] = round(time.monotonic() - t, 1)
    return SimpleNamespace(mr=mr, env=run_env, work=work, **vars(ns))


def _wait_running(live: SimpleNamespace, run: str, timeout: float = 180) -> None:
    """Until the run's job is RUNNING; fails at once, with the job's logs, if it ended instead."""
    def state() -> str | None:
        st = json.loads(live.mr("status", run, "-o", "json")[1] or "{}").get("status")
        if st in ("FAILED", "SUCCEEDED", "STOPPED"):
            pytest.fail(f"run {run} ended {st} instead of running: {live.mr('logs', run)[1][-3000:]}", pytrace=False)
        return st == "RUNNING"

    poll(f"run {run} to be RUNNING", state, timeout)


def _beyond_defaults(created: object, rendered: object, schema: dict | None, path: str = "spec") -> list[str]:
    """Where the object the API server stored differs from the rendered one, one line per path, except for
    fields the CRD's schema defaults (the API server adds those, e.g. numOfHosts: 1) holding that default."""
    schema = schema or {}
    if isinstance(created, dict) and isinstance(rendered, dict):
        props = schema.get("properties") or {}
        out = []
        for k in sorted(set(created) | set(rendered), key=str):
            sub = props.get(k) or {}
            if k not in rendered:
                if not ("default" in sub and sub["default"] == created[k]):
                    out.append(f"{path}.{k}: only in the stored object: {json.dumps(created[k])[:200]}")
            elif k not in created:
                out.append(f"{path}.{k}: rendered but not stored: {json.dumps(rendered[k])[:200]}")
            else:
                out += _beyond_defaults(created[k], rendered[k], sub, f"{path}.{k}")
        return out
    if isinstance(created, list) and isinstance(rendered, list) and len(created) == len(rendered):
        return [d for i, (x, y) in enumerate(zip(created, rendered))
                for d in _beyond_defaults(x, y, schema.get("items"), f"{path}[{i}]")]
    return [] if created == rendered else [f"{path}: stored {json.dumps(created)[:200]} != rendered "
                                           f"{json.dumps(rendered)[:200]}"]


def _json(code_out_err: tuple[int, str, str], want: int = 0) -> dict:
    code, out, err = code_out_err
    assert code == want, f"exit {code} (want {want}): {err[-3000:]}\n{out[-4000:]}"
    return json.loads(out)



def test_pods_run_restricted_as_rendered_with_one_resolver(live: SimpleNamespace) -> None:
    """The API server admitted KubeRay's pods (its init container included) in a namespace enforcing
    ``restricted``; Ray runs as uid 1000; the RayCluster ``up`` created is the one ``render -F kuberay`` prints
    (what a GitOps user applies); the pods know one resolver only, the stub inside the test's network namespace."""
    from kubernetes.stream import stream

    pods = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
    assert len(pods) == 3
    for p in pods:
        assert p.spec.security_context.run_as_non_root is True and p.spec.security_context.run_as_user == 1000
        for c in (p.spec.init_containers or []) + p.spec.containers:
            sc = c.security_context
            assert sc and sc.allow_privilege_escalation is False and sc.capabilities.drop == ["ALL"], c.name
    rendered = yaml.safe_load(live.mr("render", "-F", "kuberay", "--nodes", "2")[1])
    [created] = _rayclusters(live)
    from miles_ray.adapters import kube

    spec_schema = kube.crd_schema(kube.raycluster_crd(live.api))["properties"]["spec"]
    differences = _beyond_defaults(created["spec"], rendered["spec"], spec_schema)
    assert not differences, "the stored RayCluster is not the rendered one:\n" + "\n".join(differences)
    worker = next(p for p in pods if p.metadata.labels["ray.io/node-type"] == "worker")
    resolv = stream(live.core.connect_get_namespaced_pod_exec, worker.metadata.name, NS, container="ray",
                    command=["cat", "/etc/resolv.conf"], stderr=True, stdin=False, stdout=True, tty=False)
    assert [ln.split()[1] for ln in resolv.splitlines() if ln.startswith("nameserver")] == [realnodes.DNS_IP]


def test_ray_token_auth_on_the_kuberay_cluster(live: SimpleNamespace) -> None:
    """The default ``ray_auth: token``: the RayCluster asks KubeRay for token auth (authOptions); KubeRay made the
    token Secret and gave every Ray container RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from it. Through a
    port-forward to the real head, a request without the token is refused (401), a wrong one too (403), the
    Secret's token accepted; miles-ray's own verb through k8s:// is let in and prints no token."""
    import base64

    from miles_ray.adapters.kube import port_forward

    [rc] = _rayclusters(live)
    assert rc["spec"]["authOptions"] == {"mode": "token"}
    secret = live.core.read_namespaced_secret(NAME, NS)
    token = base64.b64decode(secret.data["auth_token"]).decode()
    assert secret.metadata.owner_references[0].name == NAME  # KubeRay's, deleted with the RayCluster
    pods = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
    assert len(pods) == 3
    for p in pods:
        env = {e.name: e for e in p.spec.containers[0].env}
        assert env["RAY_AUTH_MODE"].value == "token", p.metadata.name
        assert env["RAY_AUTH_TOKEN"].value is None  # by reference only
        assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.name == NAME
    head = next(p for p in pods if p.metadata.labels["ray.io/node-type"] == "head")
    with port_forward(live.api, NS, head.metadata.name, 8265) as url:
        for path in ("/api/jobs/", "/api/v0/nodes"):
            assert http_status(url + path, None) == 401, path
            assert http_status(url + path, "not-the-token") == 403, path
            assert http_status(url + path, token) == 200, path
    code, out, err = live.mr("submit", "--rehearse", "--nodes", "2", "--address", ADDRESS, "--dry-run", "server",
                             "-o", "json")
    assert code == 0, err[-3000:]
    assert json.loads(out)["topology"]["gpu_node_count"] == 2
    assert token not in out + err


def test_a_pods_ray_agent_port_answers_and_a_closed_port_is_told_refused(live: SimpleNamespace) -> None:
    """What 'down', 'park' and 'scale' read to tell that Ray has stopped in a Polyaxon-made pod being deleted
    (services/backends/kube/sidecars.LingeringSidecars): through a port-forward, Ray's agent port (52365, on the
    pod's loopback in every pod KubeRay makes) of a running pod is not refused, a port nothing listens on is; a
    pod that does not exist is not told refused either (only "connection refused" counts)."""
    from miles_ray.adapters.kube import port_refused
    from miles_ray.services.backends.kube.sidecars import RAY_AGENT_PORT

    pods = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
    assert len(pods) == 3
    for p in pods:
        assert port_refused(live.api, NS, p.metadata.name, RAY_AGENT_PORT) is False, p.metadata.name
        assert port_refused(live.api, NS, p.metadata.name, 7) is True, p.metadata.name
    assert port_refused(live.api, NS, "no-such-pod", 7) is False


def test_check_data_names_each_missing_path_per_node_then_passes(live: SimpleNamespace) -> None:
    rep = _json(live.mr("check-data", "--address", ADDRESS, "-o", "json"), want=4)
    assert rep["ok"] is False
    roles = sorted(n["role"] for n in rep["nodes"])
    assert roles == ["gpu worker", "gpu worker", "head"], rep["nodes"]  # the head and every GPU worker pod answered
    assert len({n["node_ip"] for n in rep["nodes"]}) == 3
    wanted = {m["path"] for n in rep["nodes"] for m in n["missing"]}
    assert wanted and all(p.startswith("/mnt/miles/") for p in wanted), wanted
    for n in rep["nodes"]:  # each node reports the same inputs missing: one shared volume
        assert {m["path"] for m in n["missing"]} == wanted
    # a token written on one pod is read on every other: one shared volume
    assert rep["same_storage"]["reference"] in {n["node_ip"] for n in rep["nodes"]}, rep["same_storage"]
    assert all(n["same_storage"] is True for n in rep["nodes"]), rep["nodes"]
    for p in wanted:  # create what was named, through the volume's directory on this machine
        local = live.volume / Path(p).relative_to("/mnt/miles")
        if local.suffix in (".jsonl", ".json", ".parquet", ".txt"):
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text("{}\n")
        else:
            local.mkdir(parents=True, exist_ok=True)
    rep = _json(live.mr("check-data", "--address", ADDRESS, "-o", "json"))
    assert rep["ok"] is True and rep["missing"] == []


def test_comm_check_across_the_two_worker_pods(live: SimpleNamespace, real_pods: RealPods) -> None:
    t = time.monotonic()
    rep = _json(live.mr("comm-check", "--address", ADDRESS, "--size-mb", "4", "-o", "json"))
    real_pods.figures["comm_check_s"] = round(time.monotonic() - t, 1)
    assert rep["ok"] is True, rep
    pods = {p.status.pod_ip for p in live.core.list_namespaced_pod(
        NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=worker").items}
    assert {n["ip"] for n in rep["nodes"]} == pods, rep["nodes"]  # one rank in each worker pod
    assert sorted(n["rank"] for n in rep["nodes"]) == [0, 1]
    assert all(n["ok"] and n["bytes_per_s"] > 0 and n["bytes_sent"] > 0 for n in rep["nodes"]), rep["nodes"]


def test_doctor_is_clean_on_a_healthy_cluster(live: SimpleNamespace) -> None:
    rep = _json(live.mr("doctor", NAME, "--backend", "kubernetes", "-o", "json"))
    problems = [f for f in rep["findings"] if f["status"] == "problem"]
    assert not problems, problems
    found = {f["check"]: f["status"] for f in rep["findings"]}
    assert found["image_drift"] == "ok" and found["pods_pending"] == "ok" and found["data"] == "ok", found
    member = next(f for f in rep["findings"] if f["check"] == "ray_membership")
    assert member["status"] == "ok" and member["summary"].endswith("(1 head, 2 worker(s))"), member
    pods = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
    assert sorted(member["evidence"]) == sorted(
        f"{p.metadata.name} ({p.metadata.labels['ray.io/node-type']}, {p.status.pod_ip}): ALIVE in Ray, "
        f"{GPUS if p.metadata.labels['ray.io/node-type'] == 'worker' else 0:g} GPUs" for p in pods)


def test_scale_is_refused_under_a_running_job_then_allowed(live: SimpleNamespace) -> None:
    rec = _json(live.mr("submit", "--mode", "direct", "--nodes", "2", "--run", "held", "--no-check-data", "--max-restarts", "0",
                        "--no-memory-check",  # a STAND-IN trainer in 2Gi pods, not Qwen3-4B
                        "--env", "MILESRAY_TEST_FAKE_TRAIN_SLEEP=600", "--no-follow", "-o", "json"))
    assert rec["created"] is True
    _wait_running(live, "held")
    code, out, err = live.mr("scale", "--nodes", "1", "--backend", "kubernetes", "--timeout", "300")
    assert code != 0 and "held" in err, (code, out, err)  # refused, naming the running job
    assert len(_rayclusters(live)) == 1
    assert _rayclusters(live)[0]["spec"]["workerGroupSpecs"][0]["replicas"] == 2  # nothing changed
    code, out, err = live.mr("stop", "held", "-y")
    assert code == 0, err
    scaled = _json(live.mr("scale", "--nodes", "1", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    assert scaled["from"] == 2 and scaled["to"] == 1 and scaled["ready_workers"] == 1
    scaled = _json(live.mr("scale", "--nodes", "2", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    assert scaled["to"] == 2 and scaled["ready_workers"] == 2


def test_worker_pod_killed_mid_rehearsal_fails_the_run_with_the_reason(live: SimpleNamespace,
                                                                       real_pods: RealPods) -> None:
    rec = _json(live.mr("submit", "--rehearse", "--nodes", "2", "--run", "workerloss", "--hold", "300",
                        "--no-follow", "-o", "json"))
    assert rec["created"] is True
    with _logs_follow(live, "workerloss") as follow:
        lines = follow.lines
        # the rehearsal has placed and checked every actor and now holds them
        poll("the rehearsal to hold its actors", lambda: any(ln.startswith("REHEARSAL_HOLDING") for ln in lines), 300)
        workers = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=worker").items
        victim = workers[0]
        t = time.monotonic()
        live.core.delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)
        follow.finish(300)
    real_pods.figures["worker_deleted_to_run_failed_s"] = round(time.monotonic() - t, 1)
    code, out, _ = live.mr("status", "workerloss", "-o", "json")
    assert code == 3 and json.loads(out)["status"] == "FAILED", out  # exit 3: the job failed
    result = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("REHEARSAL_RESULT ")]
    assert result, "".join(lines)[-3000:]
    errors = json.loads(result[-1])["errors"]
    assert errors and all("died while held" in e for e in errors), errors
    assert any(victim.status.pod_ip in e for e in errors), (victim.status.pod_ip, errors)  # names the lost node
    # KubeRay replaces the worker; Ray has both GPU workers again before the next test
    poll("Ray to see the head and both GPU worker pods of now", lambda: _ray_sees_the_pods(live), 300)
    real_pods.figures["worker_deleted_to_replacement_in_ray_s"] = round(time.monotonic() - t, 1)


def test_a_job_lost_with_its_head_pod_is_failed_and_its_resubmit_starts_attempt_2(live: SimpleNamespace,
                                                                                  real_pods: RealPods) -> None:
    """Issue 27: the head pod deleted under a running job. ``logs -f`` streaming the job ends at once with one line
    naming the head pod it lost. KubeRay brings a new head up, whose Jobs API may still say the job RUNNING (GCS
    fault tolerance keeps its entry; nothing runs it): status says FAILED, head lost, exit 3, within 10 s of the new
    head answering; submit of the same run starts attempt 2 (a new submission id), resuming from the run's
    checkpoint dir; Ray's own job list on the new head shows one job of the run running. (One head deletion
    serves both: each costs the workers' raylets about a minute to give up on the lost GCS and rejoin.)"""
    submit = ("submit", "--mode", "direct", "--nodes", "2", "--run", "lostjob", "--no-check-data", "--max-restarts", "0",
              "--no-memory-check",  # a STAND-IN trainer in 2Gi pods, not Qwen3-4B
              "--env", "MILESRAY_TEST_FAKE_TRAIN_SLEEP=600", "--no-follow", "-o", "json")
    first = _json(live.mr(*submit))
    assert first["created"] is True
    _wait_running(live, "lostjob")
    record = json.loads((live.work / "state" / "runs" / "lostjob.json").read_text())
    [head] = live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},ray.io/node-type=head").items
    ray_head = next(n for n in ray_alive_nodes(live) if n["is_head_node"])
    # the record keeps the head the job started on: its pod and Ray's head node, as Kubernetes and Ray say
    assert record["head"] == {"node_id": ray_head["node_id"], "pod": f"{NS}/{head.metadata.name}",
                              "pod_uid": head.metadata.uid}, record["head"]
    assert [a["attempt"] for a in record["attempts"]] == [1]

    # what one status run costs here (a new process, the Kubernetes client, a port-forward, the Jobs API, the
    # head's node list), on the healthy head: the time a status run needs whatever it finds
    t0 = time.monotonic()
    assert live.mr("status", "lostjob")[0] == 5
    baseline = time.monotonic() - t0
    real_pods.figures["status_run_on_healthy_head_s"] = round(baseline, 1)

    with _logs_follow(live, "lostjob") as follow:
        # delete the head only once logs -f streams the job's output (the fake trainer's first line)
        poll("logs -f to stream the job's output", lambda: any("FAKE_TRAIN" in ln for ln in follow.lines), 240)
        t = time.monotonic()
        live.core.delete_namespaced_pod(head.metadata.name, NS, grace_period_seconds=0)
        err = follow.finish(300)
    real_pods.figures["head_deleted_to_logs_exit_s"] = round(time.monotonic() - t, 1)
    assert follow.proc.returncode not in (0, None)
    last = [ln for ln in err.splitlines() if ln.strip()][-1:]
    assert last and last[0].startswith("error:") and "head" in last[0].lower(), err[-3000:]  # one clear line
    assert f"pod {NS}/{head.metadata.name}" in last[0], last[0]  # naming the head pod it lost
    assert "Traceback" not in err
    answering = poll("the new head to answer", lambda: (got := _head_api(live, "/api/version")) and
                     got[0] != head.metadata.uid and got, 300)
    t_answer = time.monotonic()
    real_pods.figures["head_deleted_to_new_head_answering_s"] = round(t_answer - t, 1)
    seen_by_ray = _head_api(live, f"/api/jobs/{first['submission_id']}")
    real_pods.figures["lost_job_state_on_new_head"] = seen_by_ray[1].get("status") if seen_by_ray else None

    tries: list[str] = []

    def lost() -> dict | None:
        t0 = time.monotonic()
        code, out, err = live.mr("status", "lostjob", "-o", "json")
        tries.append(f"+{t0 - t_answer:.1f}s ({time.monotonic() - t0:.1f}s): exit {code} "
                     f"{(json.loads(out).get('status') if out.strip() else err.strip().splitlines()[-1:])}")
        return json.loads(out) if code == 3 else None

    st = poll("status to say the job was lost with its head", lost, 60, explain=lambda: "\n".join(tries))
    real_pods.figures["new_head_answering_to_status_lost_s"] = round(time.monotonic() - t_answer, 1)
    real_pods.figures["head_deleted_to_status_lost_s"] = round(time.monotonic() - t, 1)
    real_pods.figures["status_runs_after_new_head"] = tries
    # the first status run started after the new head answered says it: no window where it says RUNNING. How long
    # that takes is a figure of the tier's summary (new_head_answering_to_status_lost_s; issue 27's target 10 s),
    # not a bound asserted here: these machines are shared and a status run's own cost varies with the load
    assert len(tries) == 1, (tries, baseline)
    assert st["status"] == "FAILED" and st["message"].startswith("head lost at "), st
    assert f"head pod {NS}/{head.metadata.name} (uid {head.metadata.uid}" in st["message"], st["message"]
    assert st["head_lost"]["head"]["pod_uid"] == head.metadata.uid
    assert st["head_lost"]["serving_head"]["pod_uid"] == answering[0]
    code, out, err = live.mr("status", "lostjob")  # the table says it too, and the exit code
    assert code == 3 and "head lost at" in out, (code, out, err)
    runs = _json(live.mr("runs", "-o", "json"))
    assert next(r for r in (runs if isinstance(runs, list) else runs["runs"]) if r["run"] == "lostjob")["status"] == "FAILED"
    code, _, err = live.mr("logs", "lostjob")  # its logs went with the head (none were saved): said, exit 3
    assert code == 3 and "head lost at" in err and "Traceback" not in err, err[-2000:]
    # status of the cluster shows the new head pod, not the deleted one
    st = poll("status to show the new head", lambda: (s := json.loads(live.mr(
        "status", "--backend", "kubernetes", "-o", "json")[1] or "{}")) and any(
        p.get("role") == "head" and p.get("name") != head.metadata.name for p in s.get("pods", [])) and s, 120)
    assert head.metadata.name not in {p.get("name") for p in st["pods"]}

    # submit of the same run: attempt 2, a new submission id, resuming from the run's checkpoint dir
    # (the GPU workers rejoin the new head a little later: --wait-for-nodes waits for them)
    again = _json(live.mr(*submit, "--wait-for-nodes"))
    real_pods.figures["head_deleted_to_attempt_2_submitted_s"] = round(time.monotonic() - t, 1)
    assert again["created"] is True and again["submission_id"] == first["submission_id"] + "-a2", again
    assert f"--load {record['checkpoint_dir']}" in again["entrypoint"], again["entrypoint"]
    _wait_running(live, "lostjob")
    real_pods.figures["head_deleted_to_attempt_2_running_s"] = round(time.monotonic() - t, 1)
    record = json.loads((live.work / "state" / "runs" / "lostjob.json").read_text())
    assert [(a["attempt"], a["submission_id"]) for a in record["attempts"]] == [
        (1, first["submission_id"]), (2, again["submission_id"])]
    assert record["attempts"][0]["lost"] is True and record["attempts"][0]["reason"].startswith("head lost at ")
    assert record["attempts"][1]["resumed_from"] == record["checkpoint_dir"]
    assert record["head"]["pod_uid"] == answering[0]

    # never two drivers: Ray's own job list on the new head has one job of the run running, attempt 2's
    def one_running() -> list | None:
        got = _head_api(live, "/api/jobs/")
        if got is None:
            return None
        mine = [j for j in got[1] if (j.get("metadata") or {}).get("miles_ray_run") == "lostjob"]
        running = [j for j in mine if j["status"] in ("PENDING", "RUNNING")]
        return mine if [j["submission_id"] for j in running] == [again["submission_id"]] else None

    jobs = poll("Ray to run only attempt 2 of the run", one_running, 60)
    old = [j for j in jobs if j["submission_id"] == first["submission_id"]]
    assert not old or old[0]["status"] in ("FAILED", "STOPPED"), old
    # a second submit of the run now returns attempt 2 as it runs: nothing new
    third = _json(live.mr(*submit))
    assert third["created"] is False and third["submission_id"] == again["submission_id"], third
    code, _, err = live.mr("stop", "lostjob", "-y")
    assert code == 0, err
    poll("Ray to see the head and both GPU worker pods of now", lambda: _ray_sees_the_pods(live), 300)


def test_park_frees_the_pods_and_resume_brings_both_workers_back_into_ray(live: SimpleNamespace,
                                                                          real_pods: RealPods) -> None:
    """(Before the image-drift test, which leaves a worker image no node can pull.)
    park: spec.suspend, every pod deleted, the RayCluster and the claim kept, the runs' driver logs saved
    first; resume: unsuspended, and it returns only once both GPU workers are ALIVE in Ray again (up's wait)."""
    code, _, err = live.mr("submit", "--rehearse", "--nodes", "2", "--run", "before-park", "--follow")
    assert code == 0, err[-3000:]
    parked = _json(live.mr("park", "-y", "--backend", "kubernetes", "--timeout", "300", "-o", "json"))
    assert parked["parked"] is True and "before-park" in parked["saved_runs"]["saved"]
    [rc] = _rayclusters(live)
    assert rc["spec"]["suspend"] is True
    assert not live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME}").items
    assert live.core.read_namespaced_persistent_volume_claim("miles-data", NS).status.phase == "Bound"
    code, out, err = live.mr("logs", "before-park")
    assert code == 0 and "REHEARSAL_RESULT " in out and "reading the saved copy" in err, err[-2000:]

    t = time.monotonic()
    back = _json(live.mr("resume", "--backend", "kubernetes", "--timeout", "600", "-o", "json"))
    real_pods.figures["resume_to_workers_in_ray_s"] = round(time.monotonic() - t, 1)
    assert back["resumed"] is True and back["status"]["ray"]["gpu_node_count"] == 2
    alive = ray_alive_nodes(live)  # Ray's own node list, not miles-ray's reading of it
    assert alive is not None and len(alive) == 3, alive  # the head and both GPU workers ALIVE
    assert sum(n["resources_total"].get("GPU", 0) for n in alive) == 2 * GPUS, alive
    st = _json(live.mr("status", "--backend", "kubernetes", "--ray", "-o", "json"))
    assert st["ray_nodes_alive"] == 3 and st["ray_gpus"] == 2 * GPUS  # and status says the same
    assert st["idle"]["idle"] is True  # a resumed cluster has run nothing since its head started


def test_doctor_names_an_image_drift(live: SimpleNamespace) -> None:
    other = "milesray.local/other:1@sha256:" + "7a" * 32
    live.crd.patch_namespaced_custom_object(
        "ray.io", "v1", NS, "rayclusters", NAME,
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/template/spec/containers/0/image", "value": other}],
        _content_type="application/json-patch+json")
    rep = _json(live.mr("doctor", NAME, "--backend", "kubernetes", "-o", "json"), want=4)
    drift = next(f for f in rep["findings"] if f["check"] == "image_drift")
    assert drift["status"] == "problem"
    assert "head and worker groups name different images" in drift["summary"]
    assert any("imageID" in e for e in drift["evidence"])  # real kubelets report what each pod runs


def test_down_deletes_the_cluster_and_keeps_the_claim(live: SimpleNamespace) -> None:
    res = _json(live.mr("down", "-y", "--backend", "kubernetes", "-o", "json"))
    assert res["deleted"] is True
    assert not _rayclusters(live)
    poll("the pods to be gone", lambda: not live.core.list_namespaced_pod(
        NS, label_selector=f"ray.io/cluster={NAME}").items, 180)
    assert live.core.read_namespaced_persistent_volume_claim("miles-data", NS).status.phase == "Bound"

