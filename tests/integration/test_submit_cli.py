"""`miles-ray submit/status/logs/stop/runs` against the real embedded Ray cluster (4 x 8 fake GPUs).

Miles itself cannot run here (no GPU, no Miles image): direct mode runs a stand-in train.py
(tests/fakes/fake_train.py, named as such) placed where Miles's would be, which records its argv and env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.ray

# Qwen3-4B's architecture flags as upstream scripts/models/qwen3-4B.py gives them (radixark/miles 31f1ca9)
MODEL_ARGS = ["--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728",
              "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
              "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
              "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "151936", "--kv-channels", "128",
              "--qk-layernorm"]


@pytest.fixture
def miles_root(tmp_path) -> Path:
    """A stand-in Miles checkout: the fake train.py (direct mode inlines the model args; nothing is sourced)."""
    root = tmp_path / "miles"
    root.mkdir()
    shutil.copy(REPO / "tests" / "fakes" / "fake_train.py", root / "train.py")
    return root


def submit(cli, address, *args):
    return cli("submit", "--address", address, "--name", "miles-test", *args)


def test_direct_mode_entrypoint_and_env_exact(env, cli, miles_root, tmp_path):
    out = tmp_path / "train.json"
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\nmegatron_path: /opt/Megatron-LM\n")
    code, stdout, err = submit(cli, env.address, "--run", "direct-1", "--nodes", "2", "--follow", "-o", "json",
                               "--env", f"MILESRAY_TEST_FAKE_TRAIN_OUT={out}", "--env", "EXTRA_FLAG=yes",
                               "--miles-commit", "abc123", "--allow-miles-drift",  # the stand-in Miles is not the catalog's
                               "--model-revision", "m-r1", "--dataset-revision", "d-r2")
    assert code == 0, err
    rec = json.loads(out.read_text())
    ckpt = "/mnt/miles/runs/direct-1/checkpoints"
    expected = MODEL_ARGS + [
        "--hf-checkpoint", "/mnt/miles/models/Qwen3-4B", "--ref-load", "/mnt/miles/models/Qwen3-4B_torch_dist",
        "--load", ckpt, "--save", ckpt, "--save-interval", "20",
        "--prompt-data", "/mnt/miles/datasets/dapo-math-17k/dapo-math-17k.jsonl", "--input-key", "prompt",
        "--label-key", "label", "--apply-chat-template", "--rollout-shuffle", "--rm-type", "deepscaler",
        "--num-rollout", "3000", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
        "--rollout-max-response-len", "8192", "--rollout-temperature", "1", "--global-batch-size", "256",
        "--balance-data", "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant",
        "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
        "--eval-interval", "20", "--eval-prompt-data", "aime", "/mnt/miles/datasets/aime-2024/aime-2024.jsonl",
        "--n-samples-per-eval-prompt", "16", "--eval-max-response-len", "16384", "--eval-top-p", "1",
        "--sglang-mem-fraction-static", "0.7",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash",
        "--use-miles-dashboard", "--dump-details", "/mnt/miles/runs/direct-1/dump_details",
        "--colocate", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8",
        "--rollout-num-gpus-per-engine", "2",
    ]
    assert rec["argv"] == expected
    assert rec["script"] == str(miles_root / "train.py")
    e = rec["env"]
    assert (e["MILES_SCRIPT_EXTERNAL_RAY"], e["PROMETHEUS_PORT"], e["NCCL_NVLS_ENABLE"], e["PYTHONUNBUFFERED"],
            e["CUDA_DEVICE_MAX_CONNECTIONS"], e["EXTRA_FLAG"]) == ("1", "9090", "0", "1", "1", "yes")
    assert e["PYTHONPATH"].split(":")[:2] == [str(miles_root), "/opt/Megatron-LM"]
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")  # the submitting environment's, as upstream
    assert (e["MASTER_ADDR"], e["no_proxy"]) == (master, f"127.0.0.1,{master}")
    # the run record carries the provenance
    code, stdout, _ = cli("runs", "-o", "json")
    [r] = [r for r in json.loads(stdout) if r["run"] == "direct-1"]
    assert (r["status"], r["miles_commit"], r["model_revision"], r["dataset_revision"]) == ("SUCCEEDED", "abc123", "m-r1", "d-r2")
    assert r["output_dir"] == "/mnt/miles/runs/direct-1" and r["recipe_hash"].startswith("sha256:")
    assert r["split"]["miles_args"][-2:] == ["--rollout-num-gpus-per-engine", "2"]
    code, _, _ = cli("status", "direct-1")
    assert code == 0  # SUCCEEDED


def test_disaggregated_direct_flags(env, cli, miles_root, tmp_path):
    out = tmp_path / "train.json"
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, _, err = submit(cli, env.address, "--run", "disagg-1", "--nodes", "3", "--layout", "disaggregated",
                          "--rollout-nodes", "1", "--follow", "-o", "json", "--env", f"MILESRAY_TEST_FAKE_TRAIN_OUT={out}")
    assert code == 0, err
    argv = json.loads(out.read_text())["argv"]
    assert "--colocate" not in argv
    assert argv[-10:] == ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8",
                          "--rollout-num-gpus-per-engine", "2", "--rollout-num-gpus", "8"]


def test_resubmitting_a_run_returns_the_existing_job(env, cli):
    code, out1, err = submit(cli, env.address, "--rehearse", "--run", "dup-1", "--nodes", "1", "--no-follow", "-o", "json")
    assert code == 0, err
    code, out2, err = submit(cli, env.address, "--rehearse", "--run", "dup-1", "--nodes", "1", "--no-follow", "-o", "json")
    assert code == 0, err
    first, second = json.loads(out1), json.loads(out2)
    assert first["created"] is True and second["created"] is False
    assert first["submission_id"] == second["submission_id"] == "miles-ray-miles-test-dup-1"
    from miles_ray.adapters.ray_jobs import list_jobs

    assert sum(1 for j in list_jobs(env.address) if j["job_id"] == "miles-ray-miles-test-dup-1") == 1
    code, _, _ = cli("logs", "dup-1", "--follow")
    assert code == 0


def test_over_ask_fails_fast_with_the_numbers(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "too-big", "--nodes", "8")
    assert code == 1
    assert "4 GPU node(s) alive, the plan needs 8 (missing 4)" in err
    code, out, _ = cli("runs", "-o", "json")
    assert json.loads(out) == []  # nothing recorded, nothing submitted


def test_wrong_gpus_per_node_is_caught(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "g4", "--nodes", "2", "--gpus-per-node", "4")
    assert code == 1 and "the plan needs exactly 4 per node" in err


def test_wait_for_nodes_times_out_with_progress(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "wait-8", "--nodes", "8", "--wait-for-nodes",
                          "--timeout", "3")
    assert code == 1 and "only 4 of 8 nodes" in err and "waiting for 8 nodes" in err


def test_resume_from_requires_the_same_recipe_and_split(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "base-a", "--nodes", "2", "--no-follow")
    assert code == 0, err
    code, _, err = cli("stop", "base-a")  # its record is what the resumes below read; its rehearsal need not run
    assert code == 0, err
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "base-b", "--nodes", "4", "--resume-from", "base-a")
    assert code == 2 and "different setup" in err and "nodes 2 != 4" in err
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "base-c", "--recipe", "Qwen3.5-4B", "--nodes", "2",
                          "--resume-from", "/mnt/miles/runs/base-a")
    assert code == 2 and "recipe hash" in err
    code, out, err = submit(cli, env.address, "--rehearse", "--run", "base-d", "--nodes", "2", "--resume-from", "base-a",
                            "--no-follow", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["output_dir"] == "/mnt/miles/runs/base-a"
    code, out, _ = cli("runs", "-o", "json", "--no-live")
    runs = {r["run"]: r for r in json.loads(out)}
    assert runs["base-d"]["resumed_from"] == "base-a"
    assert set(runs) == {"base-a", "base-d"}  # refused submits recorded nothing
    cli("stop", "base-d")


def test_two_runs_never_share_an_output_dir(env, cli):
    from miles_ray.adapters import state
    from miles_ray.core.errors import ConfigError

    code, _, err = submit(cli, env.address, "--rehearse", "--run", "own-dir", "--nodes", "1", "--no-follow")
    assert code == 0, err
    rec = state.load_record("own-dir")
    other = dict(rec, run="other-run")
    with pytest.raises(ConfigError, match="already belongs to run 'own-dir'"):
        state.create_record(other)
    cli("stop", "own-dir")


def test_stop_and_status_exit_codes(env, cli, miles_root, tmp_path):
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, _, err = submit(cli, env.address, "--run", "sleepy", "--nodes", "1", "--env", "MILESRAY_TEST_FAKE_TRAIN_SLEEP=300")
    assert code == 0, err
    code, out, _ = cli("status", "sleepy", "-o", "json")
    assert code == 5 and json.loads(out)["status"] in {"PENDING", "RUNNING"}
    code, out, _ = cli("stop", "sleepy", "-o", "json")
    # stop returns once the job has ended (as `ray job stop`), so status says so at once
    assert code == 0 and json.loads(out)["stopped"] is True and json.loads(out)["status"] == "STOPPED"
    code, _, _ = cli("status", "sleepy")
    assert code == 6


def test_no_reachable_head(env, cli):
    code, _, err = submit(cli, "http://127.0.0.1:9", "--rehearse", "--run", "nohead")
    assert code == 1 and "cannot reach the Ray Jobs API at http://127.0.0.1:9" in err


def test_secret_looking_env_refused(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--env", "HF_TOKEN=hf_abcdef", "--run", "sec")
    assert code == 2 and "looks like a credential" in err and "hf_abcdef" not in err


def test_launcher_mode_runs_the_upstream_launcher_against_the_head(env, miles_root, tmp_path):
    """The launcher replaces the miles-ray process (it pkill -9s processes named 'miles')."""
    launcher = miles_root / "scripts" / "run_qwen3_dense.py"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(
        "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}}, open({str(tmp_path / 'l.json')!r}, 'w'))\n")
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MILES_RAY_") and k != "RAY_ADDRESS"}
    environ["MILES_RAY_STATE_DIR"] = str(tmp_path / "state")
    res = subprocess.run([sys.executable, "-m", "miles_ray", "submit", "--mode", "launcher", "--nodes", "2",
                          "--address", env.address, "--name", "miles-test", "--run", "via-launcher"],
                         capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=120)
    assert res.returncode == 0, res.stderr
    rec = json.loads((tmp_path / "l.json").read_text())
    assert rec["argv"] == ["--model-name", "Qwen3-4B", "--num-nodes", "2", "--num-gpus-per-node", "8",
                           "--model-dir", "/mnt/miles/models", "--data-dir", "/mnt/miles/datasets",
                           "--output-dir", "/mnt/miles/runs/via-launcher", "--megatron-path", "/root/Megatron-LM",
                           "--run-id", "via-launcher"]
    assert rec["cwd"] == str(miles_root)
    assert rec["env"]["MILES_SCRIPT_EXTERNAL_RAY"] == "1" and rec["env"]["RAY_ADDRESS"] == env.address
    # the `ray` commands the launcher runs send the head's token (by path: never the value in the env)
    assert rec["env"]["RAY_AUTH_MODE"] == "token" and rec["env"]["RAY_AUTH_TOKEN_PATH"] == str(env.token_path)
    assert "RAY_AUTH_TOKEN" not in rec["env"]
    assert (tmp_path / "state" / "runs" / "via-launcher.json").is_file()


def test_launcher_mode_refuses_disaggregated(env, cli):
    code, _, err = submit(cli, env.address, "--mode", "launcher", "--nodes", "4", "--layout", "disaggregated",
                          "--rollout-nodes", "2", "--run", "l-dis")
    assert code == 2 and "which runs recipe Qwen3-4B colocated; this plan is disaggregated" in err


def test_scale_refuses_to_shrink_under_a_running_job(env, cli, miles_root, tmp_path):
    """The local backend's scale guard: a running job that needs 4 GPU nodes blocks 'scale --nodes 2'."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "local").symlink_to(env.state_dir)  # the session cluster, seen through this test's state dir
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, _, err = cli("submit", "--name", env.name, "--run", "needs-four", "--nodes", "4",
                       "--env", "MILESRAY_TEST_FAKE_TRAIN_SLEEP=300")
    assert code == 0, err
    try:
        code, _, err = cli("scale", "--nodes", "2", "--name", env.name)
        assert code == 2 and "needs-four" in err and "needs 4 GPU nodes" in err and "--force" in err
        assert env.status()["gpu_node_count"] == 4
    finally:
        cli("stop", "needs-four")


def test_submit_with_data_preflight_refuses_missing_data(env, cli, miles_root, tmp_path):
    """--check-data runs check-data's job on every node before submitting: nothing is submitted or recorded
    when the recipe's model dirs and datasets are missing from the shared volume."""
    mount = tmp_path / "volume"
    mount.mkdir()
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\nmount_path: {mount}\n")
    code, _, err = submit(cli, env.address, "--run", "no-data", "--nodes", "1", "--check-data")
    assert code == 1, err
    assert "data preflight failed" in err and "Qwen3-4B" in err
    code, out, _ = cli("runs", "-o", "json", "--no-live")
    assert json.loads(out) == []


def test_a_failed_job_exits_3_everywhere_and_json_is_one_document(env, cli, miles_root, tmp_path):
    """The stand-in train.py exits 7, so the job FAILS: submit --follow, logs --follow and status RUN all exit 3
    (one exit-code table); with -o json each prints ONE document (the job's final state and its logs) while
    progress stays on stderr."""
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, out, err = submit(cli, env.address, "--run", "fails", "--nodes", "1", "--env", "MILESRAY_TEST_FAKE_TRAIN_EXIT=7",
                            "--follow", "-o", "json")
    assert code == 3, err
    doc = json.loads(out)
    assert (doc["run"], doc["status"], doc["submission_id"]) == ("fails", "FAILED", "miles-ray-miles-test-fails")
    assert "FAKE_TRAIN " in doc["logs"]
    lines = err.splitlines()
    assert lines[0] == "[0s] submitting run fails" and "run fails: FAILED" in lines
    assert [ln for ln in lines if ln.startswith("error:")] == [
        "error: run fails: the job FAILED (read its logs with 'miles-ray logs fails')"]
    code, out, _ = cli("status", "fails", "-o", "json")
    assert code == 3 and json.loads(out)["status"] == "FAILED"
    code, out, _ = cli("logs", "fails", "-f", "-o", "json")
    assert code == 3 and json.loads(out)["status"] == "FAILED" and "FAKE_TRAIN " in json.loads(out)["logs"]
    code, out, _ = cli("logs", "fails")  # without --follow: the logs as they are, exit 0
    assert code == 0 and "FAKE_TRAIN " in out


def test_dry_run_client_contacts_nothing_and_is_the_job_submit_then_sends(env, cli, miles_root, tmp_path):
    """--dry-run client: the exact job (entrypoint, runtime env, ids, record) with no head reachable and nothing
    written; the job then submitted for real has that same entrypoint, id and output dir."""
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, out, err = submit(cli, "http://127.0.0.1:9", "--run", "dry-1", "--nodes", "2", "--dry-run", "client",
                            "-o", "json")  # port 9: nothing listens there
    assert code == 0, err
    dry = json.loads(out)
    assert dry["dry_run"] == "client" and dry["created"] is False and dry["kind"] == "ray-job"
    assert dry["runtime_env"]["env_vars"]["MILES_SCRIPT_EXTERNAL_RAY"] == "1"
    assert dry["entrypoint"].startswith("python3 ") and "/train.py " in dry["entrypoint"] and "--actor-num-nodes 2" in dry["entrypoint"]
    assert list((tmp_path / "state").rglob("dry-1*")) == []  # no run record
    code, out, err = submit(cli, env.address, "--run", "dry-1", "--nodes", "2", "--no-follow", "-o", "json")
    assert code == 0, err
    real = json.loads(out)
    assert (real["entrypoint"], real["submission_id"], real["output_dir"]) == (
        dry["entrypoint"], dry["submission_id"], dry["output_dir"])
    cli("stop", "dry-1", "-y")


def test_dry_run_server_checks_the_live_topology(env, cli, miles_root, tmp_path):
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, out, err = submit(cli, env.address, "--run", "dry-2", "--nodes", "2", "--dry-run", "server", "-o", "json")
    assert code == 0, err
    dry = json.loads(out)
    assert dry["dry_run"] == "server" and dry["problems"] == []
    assert dry["record"]["ray_version"] == "2.60.0"  # the head's own Ray version, read live
    code, out, err = submit(cli, env.address, "--run", "dry-3", "--nodes", "8", "--dry-run", "server", "-o", "json")
    assert code == 4, err
    dry = json.loads(out)
    assert dry["problems"] and any("GPU" in p for p in dry["problems"]), dry["problems"]
    assert "1 problem" in err or "problem(s)" in err
    assert list((tmp_path / "state").rglob("dry-*")) == []


def test_without_nodes_or_gpus_submit_plans_for_the_live_cluster(env, cli, miles_root, tmp_path):
    """Neither -N nor -G: the plan takes the live cluster's shape (4 GPU workers x 8 here) and says so in one
    notice line; a client dry run contacts nothing, so it keeps the configured shape."""
    (tmp_path / "miles-ray.yaml").write_text(f"miles_root: {miles_root}\n")
    code, out, err = submit(cli, env.address, "--run", "live-1", "--dry-run", "server", "-o", "json")
    assert code == 0, err
    dry = json.loads(out)
    assert dry["record"]["split"]["nodes"] == 4 and dry["record"]["split"]["gpus_per_node"] == 8
    assert "--actor-num-nodes 4" in dry["entrypoint"] and dry["problems"] == []
    notes = [ln for ln in err.splitlines() if "notice: planning for the live cluster" in ln]
    assert len(notes) == 1 and "4 GPU node(s) x 8 GPUs" in notes[0], err
    code, out, err = submit(cli, "http://127.0.0.1:9", "--run", "live-1", "--dry-run", "client", "-o", "json")
    assert code == 0 and json.loads(out)["record"]["split"]["nodes"] == 1, err


def test_a_plan_that_does_not_fit_names_the_flag_that_fixes_it(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "g2", "--nodes", "1", "--gpus-per-node", "2")
    assert code == 1 and "pass --gpus-per-node 8" in err, err
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "n8", "--nodes", "8")
    assert code == 1 and "--nodes 4" in err and "'miles-ray scale --nodes 8'" in err, err
    code, _, err = submit(cli, env.address, "--recipe", "Qwen3-235B-A22B", "--run", "big", "--rehearse")
    assert code == 2 and "'miles-ray recipes --fits 4x8'" in err, err
    assert json.loads(cli("runs", "-o", "json")[1]) == []  # nothing recorded


def test_a_run_name_submitted_again_with_another_request_is_refused(env, cli):
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "same-1", "--nodes", "1", "--no-follow")
    assert code == 0, err
    code, _, err = submit(cli, env.address, "--rehearse", "--run", "same-1", "--nodes", "2", "--no-follow")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "nodes 1 != 2" in lines[0] and "--resume-from same-1" in lines[0], err
    code, out, err = submit(cli, env.address, "--rehearse", "--run", "same-1", "--nodes", "1", "--no-follow",
                            "-o", "json")
    assert code == 0 and json.loads(out)["created"] is False, err  # the same request: its job, not a second one
    cli("stop", "same-1", "-y")
