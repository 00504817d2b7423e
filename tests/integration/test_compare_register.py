"""`miles-ray runs compare` and `miles-ray register` against real components: the embedded Ray cluster
(runs submitted through the Jobs API, metrics read back from the job logs) and the real Polyaxon API
server (haupt sandbox) for the model registry.

Miles cannot run here (no GPU, no Miles image): each run's train.py is the STAND-IN
tests/fakes/fake_metrics_train.py, which prints Miles-shaped metric lines and writes Megatron-shaped
checkpoint dirs (Miles' numbering: iter_0000019, iter_0000039, after rollouts 19 and 39 of 0..39) under
the run's output dir -- on this machine, because the
config's mount_path points into the test's tmp dir."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest
import yaml

from tests.conftest import REPO
from tests.infra.fixtures import poll

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def world(local_ray, tmp_path_factory):
    """Three finished stand-in runs on the session cluster: a (eval 0.30), b (eval 0.45) on the same eval
    data and dataset revision, c on different eval data (another recipe's eval_data)."""
    tmp = tmp_path_factory.mktemp("cmpreg")
    root = tmp / "miles"
    root.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fakes" / "fake_metrics_train.py", root / "train.py")  # STAND-IN train.py
    mount = tmp / "mnt"
    (tmp / "miles-ray.yaml").write_text(f"miles_root: {root}\nmount_path: {mount}\n")
    from miles_ray.core.recipes import get_recipe

    other = get_recipe("Qwen3-4B").model_dump(mode="json")
    other.update(name="Qwen3-4B-aime25", eval_data="aime-2025/aime-2025.jsonl",  # the flags direct mode passes too
                 train_args=[a.replace("aime-2024/aime-2024.jsonl", "aime-2025/aime-2025.jsonl")
                             for a in other["train_args"]])
    (tmp / "recipes.yaml").write_text(yaml.safe_dump({"recipes": [other]}))
    return {"tmp": tmp, "mount": mount, "state": tmp / "state", "cluster": local_ray}


@pytest.fixture
def env(world, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(world["state"]))
    for key in [k for k in os.environ if k.startswith("MILES_RAY_") and k != "MILES_RAY_STATE_DIR"] + [
            "RAY_ADDRESS", "POLYAXON_HOST"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(world["tmp"])
    return world


def submit_run(cli, world, run, eval_final, *extra) -> bool:
    """Submit ``run`` without following it (the three run side by side); False when the module already did."""
    if (world["state"] / "runs" / f"{run}.json").exists():
        return False
    code, _, err = cli("submit", "--address", world["cluster"].address, "--name", "miles-test", "--run", run,
                       "--nodes", "1", "--num-rollout", "40", "--no-follow", "-o", "json", "--miles-commit", "abc123",
                       "--allow-miles-drift", "--env", f"MILESRAY_TEST_FAKE_EVAL_FINAL={eval_final}", *extra)
    assert code == 0, err
    return True


def run_status(cli, run) -> dict:
    code, out, err = cli("status", run, "-o", "json")
    assert out, err
    return json.loads(out)


@pytest.fixture
def runs(env, cli):
    submitted = [run for run, ok in (
        ("cmp-a", submit_run(cli, env, "cmp-a", 0.30, "--dataset-revision", "d1", "--model-revision", "m1")),
        ("cmp-b", submit_run(cli, env, "cmp-b", 0.45, "--dataset-revision", "d1", "--model-revision", "m1")),
        ("cmp-c", submit_run(cli, env, "cmp-c", 0.90, "--dataset-revision", "d1", "--model-revision", "m1",
                             "--recipe", "Qwen3-4B-aime25", "--recipe-file", str(env["tmp"] / "recipes.yaml"))))
        if ok]
    for run in submitted:
        st = poll(f"run {run} to end", lambda: (s := run_status(cli, run))["status"] in (
            "SUCCEEDED", "FAILED", "STOPPED") and s, 300)
        assert st["status"] == "SUCCEEDED", st
    return env


# ---------------------------------------------------------------------------------------- compare

def test_same_eval_data_names_the_better_run_and_says_it_is_not_proof(runs, cli):
    code, out, err = cli("runs", "compare", "cmp-a", "cmp-b", "-o", "json")
    assert code == 0, err
    r = json.loads(out)
    v = r["verdict"]
    assert (v["better"], v["metric"], v["refused"]) == ("cmp-b", "eval/aime", False)
    assert "0.45 vs 0.3" in v["statement"] and "not by itself proof of a better model" in v["caveat"]
    rows = {m["metric"]: m for m in r["metrics"]}
    assert (rows["eval/aime"]["a"], rows["eval/aime"]["a_at"]) == (0.3, 39)
    assert (rows["eval/aime"]["b"], rows["eval/aime"]["b_at"]) == (0.45, 39)
    assert rows["rollout/raw_reward"]["a"] == rows["rollout/raw_reward"]["b"] == 0.5
    # perf + rollout + step per rollout; evals as Miles' train.py runs them: before training (at rollout 0), then
    # after rollouts 19 and 39
    assert r["metric_lines"]["a"] == 40 * 3 + 3
    prov = {p["field"]: p for p in r["provenance"]}
    assert prov["recipe_hash"]["same"] and prov["miles_commit"]["a"] == "abc123"
    assert prov["output_dir"]["a"].endswith("/runs/cmp-a") and not prov["output_dir"]["same"]
    assert r["eval"]["same"] is True
    assert r["eval"]["a"]["data"] == {"aime": str(runs["mount"] / "datasets/aime-2024/aime-2024.jsonl")}

    code, out, _ = cli("runs", "compare", "cmp-a", "cmp-b")
    assert code == 0
    assert "cmp-b has the better final eval/aime: 0.45 vs 0.3" in out
    assert "not by itself proof of a better model" in out


def test_different_eval_data_shows_metrics_but_refuses_to_judge(runs, cli):
    code, out, err = cli("runs", "compare", "cmp-a", "cmp-c", "-o", "json")
    assert code == 0, err
    r = json.loads(out)
    assert r["verdict"]["better"] is None and r["verdict"]["refused"] is True
    assert "evaluation data differ" in r["verdict"]["statement"] and "aime-2025" in r["verdict"]["statement"]
    rows = {m["metric"]: (m["a"], m["b"]) for m in r["metrics"]}
    assert rows["eval/aime"] == (0.3, 0.9)  # still shown side by side
    prov = {p["field"]: p for p in r["provenance"]}
    assert not prov["recipe"]["same"] and not prov["recipe_hash"]["same"]
    code, out, _ = cli("runs", "compare", "cmp-c", "cmp-a")
    assert "not saying which run is better" in out and "has the better" not in out


def test_compare_bad_input(runs, cli):
    code, _, err = cli("runs", "compare", "cmp-a", "nope")
    assert code == 1 and "no run named 'nope'" in err
    code, _, err = cli("runs", "compare", "cmp-a", "cmp-a")
    assert code == 2 and "two different runs" in err


# ---------------------------------------------------------------------------------------- register

@pytest.fixture
def registry(polyaxon_server, monkeypatch):
    from miles_ray.adapters.polyaxon_api import PolyaxonApi

    api = PolyaxonApi(polyaxon_server.host, retries=2, backoff=0.05)
    project = f"miles-{uuid.uuid4().hex[:8]}"
    polyaxon_server.create_project(project)
    return {"api": api, "host": polyaxon_server.host, "project": project,
            "pc": api.project_client("default", project)}


def versions(reg) -> list[str]:
    return [v.name for v in (reg["pc"].list_model_versions().results or [])]


def test_register_reads_back_with_artifacts_and_source(runs, registry, cli):
    code, out, err = cli("register", "cmp-b", "--checkpoint", "39", "--polyaxon-host", registry["host"],
                         "--project", registry["project"], "--tag", "candidate", "-o", "json")
    assert code == 0, err
    res = json.loads(out)
    ckpt = str(runs["mount"] / "runs/cmp-b/checkpoints/iter_0000039")
    assert res["version"] == "cmp-b-iter-39" and res["checkpoint"] == ckpt
    assert res["checked"]["iterations"] == [19, 39] and res["checked"]["where"].startswith("worker 127.0.0.")
    assert "not a quality gate" in res["note"]
    # read it back from the server through the polyaxon client
    v = registry["pc"].get_model_version("cmp-b-iter-39")
    content = json.loads(v.content)
    assert [a["path"] for a in content["artifacts"]] == [ckpt]
    assert content["source_run"] == "cmp-b" and content["checkpoint_iteration"] == 39
    assert content["provenance"]["miles_commit"] == "abc123" and content["provenance"]["dataset_revision"] == "d1"
    assert "cmp-b" in v.description and "not a quality gate" in v.description
    assert {"miles", "miles-ray", "qwen3-4b", "candidate"} <= set(v.tags)
    assert versions(registry) == ["cmp-b-iter-39"]

    code, out, err = cli("register", "cmp-b", "--checkpoint", "39", "--polyaxon-host", registry["host"],
                         "--project", registry["project"])
    assert code == 2 and "already exists" in err and "--force" in err


def test_missing_checkpoint_is_refused_and_nothing_registered(runs, registry, cli):
    code, out, err = cli("register", "cmp-a", "--checkpoint", "30", "--polyaxon-host", registry["host"],
                         "--project", registry["project"])
    assert code == 2
    assert "checkpoint iteration 30 does not exist" in err and "existing iterations: 19, 39" in err
    assert sum(1 for line in err.splitlines() if line.startswith("error:")) == 1 and "Traceback" not in err
    assert versions(registry) == []
    # the same answer when looking on this machine (what the local backend does)
    code, _, err = cli("register", "cmp-a", "--checkpoint", "30", "--check-via", "local",
                       "--polyaxon-host", registry["host"], "--project", registry["project"])
    assert code == 2 and "existing iterations: 19, 39" in err and "this machine" in err
    assert versions(registry) == []


def test_register_links_the_polyaxon_run_when_the_record_has_one(runs, registry, cli):
    """A run record with a Polyaxon run uuid: the checkpoint is logged as MODEL lineage on that run and
    the version links run + artifacts (the uuid here is a real run created on the sandbox)."""
    from miles_ray.adapters import state

    op = {"version": 1.1, "kind": "operation", "name": "cmp-b-source",
          "component": {"kind": "component", "run": {"kind": "job", "container": {"image": "busybox"}}}}
    run_uuid = registry["api"].create_operation("default", registry["project"], op, known_connections=[])
    rec = state.load_record("cmp-b")
    state.save_record({**rec, "run": "cmp-b-px", "polyaxon_run_uuid": run_uuid})
    try:
        code, out, err = cli("register", "cmp-b-px", "--checkpoint", "19", "--version", "q4-rl-v1",
                             "--polyaxon-host", registry["host"], "--project", registry["project"])
        assert code == 0, err
        assert "not a quality gate" in out and f"Polyaxon run {run_uuid}" in out
        v = registry["pc"].get_model_version("q4-rl-v1")
        assert v.run == run_uuid and v.artifacts == ["checkpoint-iter_0000019"]
        [art] = v.meta_info["artifacts"]
        assert art["path"] == str(runs["mount"] / "runs/cmp-b/checkpoints/iter_0000019") and art["kind"] == "model"
    finally:
        state.record_path("cmp-b-px").unlink(missing_ok=True)


def test_register_needs_a_registry(runs, cli):
    code, _, err = cli("register", "cmp-a", "--checkpoint", "19")
    assert code == 2 and "model registry is not enabled" in err
