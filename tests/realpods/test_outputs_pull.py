"""``runs pull`` on real pods (issue 37 item 3): a run's checkpoint taken home through a short-lived pod that mounts
the run's claim in the cluster's pinned image (miles_ray/core/pull_pod.py), on a KubeRay cluster whose namespace
enforces the restricted Pod Security Standard.

One cluster (``up --via kuberay --nodes 1``), one run of the FAKE checkpointing trainer (4 rollouts, a checkpoint
every 2: iter_0000001 and iter_0000003). The newest checkpoint is made bigger by the test (shards of random bytes
written into its dir on the claim, named as such: the stand-in's own files are a few bytes) so that a pull can be cut
half way: ``runs pull`` killed (SIGTERM) while it copies exits 130 and leaves no pod; run again, it copies only what
is missing (the finished files keep their mtime) and every pulled file's sha256 equals the sha256 computed on the
claim independently (``sha256sum`` exec'd in the Ray head pod, which mounts it); no pull pod is left.

What is fake here, and why: the GPUs and Miles's ``train.py`` (tests/fakes/fake_ray_ckpt_train.py on the claim as
``miles_root``/train.py: real training needs GPUs and Miles' image), and the size of the shards written beside its
checkpoint files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.infra.fixtures import poll
from tests.infra.realpods import RealPods

pytestmark = pytest.mark.real_pods

REPO = Path(__file__).resolve().parents[2]
SEQUENCE = REPO / "scripts" / "smoke-sequence.sh"
NS = "miles-pull"
NAME = "pull"
GPUS = 2
RUN = "pulled"
SHARDS = 12  # written into the newest checkpoint by the test: SHARDS x SHARD_MIB of random bytes
SHARD_MIB = 16


def bring_up(real_pods: RealPods, work: Path) -> SimpleNamespace:
    """Namespace miles-pull (restricted), claim miles-data with the FAKE trainer, ``up --via kuberay --nodes 1``, one
    run of 4 rollouts (a checkpoint every 2) ended SUCCEEDED. ``.mr(*args)`` runs miles-ray against it, ``.popen``
    starts it, ``.down()`` removes it all. Shared with benchmarks/bench_pull.py."""
    from kubernetes import client

    api = real_pods.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS, labels={
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"})))
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

    def popen(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "miles_ray", *args], env=run_env, cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    live = SimpleNamespace(api=api, core=core, volume=volume, work=work, mr=mr, popen=popen)

    def down() -> None:
        try:
            mr("down", "-y", "--backend", "kubernetes", timeout=600)
        finally:
            rcs = client.CustomObjectsApi(api)
            for rc in rcs.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")["items"]:
                rcs.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc["metadata"]["name"])
            poll("every pod of the namespace to be gone", lambda: not core.list_namespaced_pod(NS).items, 300)
            core.delete_namespace(NS)

    live.down = down
    try:
        t = time.monotonic()
        code, out, err = mr("up", "--via", "kuberay", "--nodes", "1", "--timeout", "600", "-o", "json")
        assert code == 0, err[-4000:]
        live.up_s = round(time.monotonic() - t, 1)
        code, out, err = mr("submit", "--mode", "direct", "--nodes", "1", "--run", RUN, "--no-check-data",
                            "--no-follow", "--no-memory-check", "--max-restarts", "0", "--num-rollout", "4",
                            "--extra-args", "--save-interval 2", "--env", "MILESRAY_TEST_STEP_SECONDS=0.2",
                            "--env", "MILESRAY_TEST_GPU_WORKERS=1", "--env", f"MILESRAY_TEST_GPUS_PER_WORKER={GPUS}",
                            "-o", "json")
        assert code == 0, err[-4000:]
        st = poll(f"run {RUN} to end", lambda: (s := _status(live))["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
                  and s, 600, interval=2)
        assert st["status"] == "SUCCEEDED", json.dumps(st)[-3000:]
        record = json.loads((work / "state" / "runs" / f"{RUN}.json").read_text())
        live.root = record["checkpoint_dir"]  # as the pods see it
        live.root_here = volume / Path(live.root).relative_to("/mnt/miles")
    except BaseException:
        down()
        raise
    return live


def _status(live: SimpleNamespace) -> dict:
    code, out, err = live.mr("status", RUN, "-o", "json")
    assert out.strip(), f"status {RUN}: exit {code}: {err[-2000:]}"
    return json.loads(out)


def grow(live: SimpleNamespace, iteration: int, shards: int = SHARDS, mib: int = SHARD_MIB) -> None:
    """Shards of random bytes written into checkpoint ``iteration`` on the claim (the stand-in's files are tiny)."""
    d = live.root_here / f"iter_{iteration:07d}"
    for i in range(shards):
        with open(d / f"bench_shard_{i:02d}.bin", "wb") as fh:  # not .distcp (that would need a .metadata)
            for _ in range(mib):
                fh.write(os.urandom(1 << 20))


def claim_sha256(live: SimpleNamespace, iteration: int) -> dict[str, str]:
    """sha256 of every file of checkpoint ``iteration`` computed on the claim by ``sha256sum`` in the Ray head pod
    (exec through the API): not by miles-ray."""
    from kubernetes.stream import stream

    [head] = [p for p in live.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={NAME},"
                                                                           "ray.io/node-type=head").items
              if p.status.phase == "Running"]
    d = f"{live.root}/iter_{iteration:07d}"
    text = stream(live.core.connect_get_namespaced_pod_exec, head.metadata.name, NS, container="ray",
                  command=["sh", "-c", f"cd {d} && find . -type f -print0 | xargs -0 sha256sum"],
                  stderr=True, stdin=False, stdout=True, tty=False)
    out = {}
    for line in text.splitlines():
        digest, path = line.split(None, 1)
        out[f"iter_{iteration:07d}/{path.strip()[2:]}"] = digest
    return out


def pull_pods(live: SimpleNamespace) -> list:
    return live.core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=miles-ray-pull").items


@pytest.fixture(scope="module")
def live(real_pods: RealPods, tmp_path_factory: pytest.TempPathFactory):
    t = time.monotonic()
    got = bring_up(real_pods, tmp_path_factory.mktemp("pull"))
    try:
        yield got
    finally:
        got.down()
        real_pods.figures["outputs_pull_module_s"] = round(time.monotonic() - t, 1)


def test_pull_through_the_claim_resumes_after_a_kill_and_matches_the_claims_sha256(live: SimpleNamespace,
                                                                                   real_pods: RealPods) -> None:
    code, out, err = live.mr("runs", "outputs", RUN, "-o", "json")
    assert code == 0, err[-3000:]
    complete = [c["iteration"] for c in json.loads(out)["checkpoints"] if c["complete"]]
    assert complete == [1, 3], out[-2000:]  # Miles' numbering: rollouts 1 and 3 of 0..3, a checkpoint every 2
    grow(live, 3)
    dest = live.work / "home"
    # cut half way: SIGTERM once some files are whole in DIR
    proc = live.popen("runs", "pull", RUN, "--to", str(dest))
    try:
        poll("the pull to finish 2 files", lambda: proc.poll() is not None or len(
            [p for p in dest.rglob("bench_shard_*") if not p.name.endswith(".miles-ray-part")]) >= 2, 300,
             interval=0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]  # interrupted, not finished
    assert "interrupted at" in err and "run the same command again" in err and "Traceback" not in err, err[-3000:]
    assert not pull_pods(live)  # deleted on the way out
    finished = {str(p.relative_to(dest)): p.stat().st_mtime_ns for p in dest.rglob("*")
                if p.is_file() and not p.name.endswith(".miles-ray-part")}
    assert 2 <= len(finished) < SHARDS, finished
    assert not (dest / ".miles-ray-pull.json").exists()
    # again: completes, copying only what is missing
    t = time.monotonic()
    code, out, err = live.mr("runs", "pull", RUN, "--to", str(dest), "-o", "json")
    real_pods.figures["outputs_pull_resume_s"] = round(time.monotonic() - t, 1)
    assert code == 0, err[-3000:]
    got = json.loads(out)
    assert got["iteration"] == 3 and got["verified"] is True
    assert got["skipped_files"] == len(finished) and got["copied_files"] == got["files"] - len(finished), got
    assert {p: (dest / p).stat().st_mtime_ns for p in finished} == finished  # not copied again
    assert "RayCluster" in got["source"] and "through pod" in got["source"]
    # each pulled file's sha256 equals the claim's, computed there by sha256sum
    on_claim = claim_sha256(live, 3)
    pulled = {str(p.relative_to(dest)): hashlib.sha256(p.read_bytes()).hexdigest() for p in dest.rglob("*")
              if p.is_file() and p.parent != dest}
    assert pulled == on_claim and len(on_claim) >= SHARDS, (sorted(pulled), sorted(on_claim))
    assert (dest / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert not list(dest.rglob("*.miles-ray-part")) and not pull_pods(live)
    # bad input creates no pod: a partial or missing checkpoint is refused before one starts
    code, _, err = live.mr("runs", "pull", RUN, "--iteration", "2", "--to", str(live.work / "nope"))
    assert code == 2 and "has no checkpoint 2" in err and not (live.work / "nope").exists() and not pull_pods(live)
