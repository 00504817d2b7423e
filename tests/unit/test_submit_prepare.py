"""submit's prepare step (miles_ray.core.submission), which must be pure: from config, request and the resolved
head address to the complete job -- entrypoint, runtime env, submission id, metadata, run record, output dir,
or the launcher command / Polyaxon operation -- and every refusal of bad input, without any I/O."""

from __future__ import annotations

import builtins
import shlex
import socket

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.entrypoint import (RUN_NAME, default_run_name, direct_argv, direct_job_env, launcher_argv,
                                       launcher_job_operation, submission_id)
from miles_ray.core.errors import ConfigError, Conflict, PlanError
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from miles_ray.core.runs import SCHEMA, ResumeTarget, RunRecord
from miles_ray.core.submission import (SubmitJob, SubmitRequest, SubmitTarget, check_head_ray_version, prepare_submit,
                                       validate_request)
from tests.conftest import DIGEST, IMAGE

CREATED = "2026-12-02T12:00:00+00:00"
LAUNCHERS = "/opt/miles-ray/launchers"
URL = "http://10.0.0.5:8265"
K8S = "k8s://ml/q4"
SERVICE = "http://q4-head-svc.ml.svc:8265"
SPLIT_KEYS = {"layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
              "rollout_num_gpus_per_engine", "miles_args", "colocate"}


def config(**over):
    return load_config({"name": "q4", "namespace": "ml", "nodes": 2, **over}, environ={})


def prepare(cfg=None, target=None, *, created=CREATED, existing=None, resume=None, environ=None,
            **request) -> SubmitJob:
    cfg = cfg or config()
    valid = validate_request(cfg, SubmitRequest(**request))
    return prepare_submit(cfg, valid, target or SubmitTarget("address", URL), created=created,
                          launchers_dir=LAUNCHERS, existing=existing, resume=resume, environ=environ)


@pytest.fixture
def no_io(monkeypatch):
    """Any file open or network connection during prepare fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"I/O during prepare: {args[:2]}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# -- the complete job ------------------------------------------------------------------------------

def test_direct_job_is_complete(no_io):
    cfg = config(image=IMAGE, ray_version="2.60.0", env={"WANDB_MODE": "offline"})
    environ = {"MASTER_ADDR": "10.1.2.3", "NCCL_DEBUG": "INFO", "PYTHONPATH": "/site/extra", "HOME": "/home/u"}
    job = prepare(cfg, run="q4-a", env=["EXTRA_FLAG=yes"], extra_args=["--lr", "2e-6"], miles_commit="abc123",
                  model_revision="m1", dataset_revision="d1", num_rollout=40, environ=environ)
    recipe, plan = BUILTIN["Qwen3-4B"], plan_split(BUILTIN["Qwen3-4B"], 2, 8)
    out = "/mnt/miles/runs/q4-a"
    assert job.kind == "ray-job" and job.run == "q4-a" and job.output_dir == out
    assert job.submission_id == submission_id("q4", "q4-a") == "miles-ray-q4-q4-a"
    assert job.entrypoint == shlex.join(direct_argv(cfg, recipe, plan, out, "q4-a", ["--lr", "2e-6"], num_rollout=40))
    argv = shlex.split(job.entrypoint)
    # train.py itself, model architecture flags inlined (nothing sourced), the run's flags, split flags, extra args
    assert argv[:2] == ["python3", "/root/miles/train.py"] and "bash" not in argv and "source" not in job.entrypoint
    assert argv[2:2 + len(recipe.model_args)] == recipe.model_args and "--num-layers" in recipe.model_args
    assert argv[argv.index("--num-rollout") + 1] == "40" and argv.count("--num-rollout") == 1
    assert argv[argv.index("--load") + 1] == f"{out}/checkpoints"
    assert argv[argv.index("--dump-details") + 1] == f"{out}/dump_details"
    assert argv[-len(plan.miles_args) - 2:] == [*plan.miles_args, "--lr", "2e-6"]
    assert job.runtime_env == {"env_vars": direct_job_env(cfg, URL, recipe, environ, {"EXTRA_FLAG": "yes"})}
    env = job.runtime_env["env_vars"]
    assert (env["RAY_ADDRESS"], env["MILES_SCRIPT_EXTERNAL_RAY"], env["EXTRA_FLAG"], env["WANDB_MODE"]) == (
        URL, "1", "yes", "offline")
    assert (env["MASTER_ADDR"], env["no_proxy"], env["NCCL_DEBUG"], env["PYTHONPATH"]) == (
        "10.1.2.3", "127.0.0.1,10.1.2.3", "INFO", "/root/miles:/root/Megatron-LM:/site/extra")
    assert "HOME" not in env and "NCCL_SOCKET_IFNAME" not in env  # only the launcher's pass-through, when set
    assert job.metadata == {"miles_ray_run": "q4-a", "recipe": "Qwen3-4B", "recipe_hash": recipe.content_hash(),
                            "cluster": "q4", "mode": "direct", "layout": "colocated", "image_digest": DIGEST,
                            "output_dir": out}
    rec = job.record
    RunRecord.model_validate(rec)
    assert rec["schema"] == SCHEMA and set(rec["split"]) == SPLIT_KEYS
    assert {k: rec[k] for k in ("run", "cluster", "backend", "address", "submission_id", "mode", "created", "image",
                                "image_digest", "ray_version", "miles_commit", "model_revision", "dataset_revision",
                                "recipe", "recipe_hash", "output_dir", "resumed_from", "entrypoint")} == {
        "run": "q4-a", "cluster": "q4", "backend": "address", "address": URL, "submission_id": "miles-ray-q4-q4-a",
        "mode": "direct", "created": CREATED, "image": IMAGE, "image_digest": DIGEST, "ray_version": "2.60.0",
        "miles_commit": "abc123", "model_revision": "m1", "dataset_revision": "d1", "recipe": "Qwen3-4B",
        "recipe_hash": recipe.content_hash(), "output_dir": out, "resumed_from": None, "entrypoint": job.entrypoint}
    assert rec["split"]["miles_args"] == plan.miles_args and rec["recipe_spec"] == recipe.model_dump(mode="json")
    assert (rec["checkpoint_dir"], rec["load_dir"], rec["checkpoint_dirs_from"]) == (
        f"{out}/checkpoints", f"{out}/checkpoints", "job")
    assert not job.check_data and job.resume is None and job.existing is None and job.operation is None


def test_unnamed_run_gets_a_name_from_recipe_size_and_time(no_io):
    job = prepare()
    plan = plan_split(BUILTIN["Qwen3-4B"], 2, 8)
    assert job.run == default_run_name(BUILTIN["Qwen3-4B"], plan, CREATED) and RUN_NAME.match(job.run)
    assert job.run.startswith("qwen3-4b-2n-") and job.submission_id == f"miles-ray-q4-{job.run}"
    assert prepare().run == job.run  # pure: the same inputs, the same job
    assert prepare(created="2026-12-02T12:00:01+00:00").run != job.run


def test_rehearsal_runs_the_driver_with_the_heads_python_and_touches_no_data(no_io):
    job = prepare(target=SubmitTarget("local", "http://127.0.0.1:8265", python="/venv/bin/python"), rehearse=True,
                  timeout=3, check_data=True)
    plan = plan_split(BUILTIN["Qwen3-4B"], 2, 8)
    assert shlex.split(job.entrypoint) == ["/venv/bin/python", "rehearse.py", *plan.miles_args, "--timeout", "10"]
    assert job.runtime_env["working_dir"] == LAUNCHERS and job.record["mode"] == "rehearse"
    assert job.check_data is False and job.kind == "ray-job"
    long = prepare(rehearse=True, timeout=5000)
    assert shlex.split(long.entrypoint)[0] == "python3" and shlex.split(long.entrypoint)[-2:] == ["--timeout", "600"]
    # --extra-args reach the rehearsal after the split flags, as they reach train.py (they may change the placement)
    debug = prepare(rehearse=True, extra_args=["--debug-train-only", "--eval-num-gpus", "8"])
    assert shlex.split(debug.entrypoint)[1:] == ["rehearse.py", *plan.miles_args, "--debug-train-only",
                                                 "--eval-num-gpus", "8", "--timeout", "120"]


def test_kubernetes_head_gets_the_service_url_and_the_data_preflight(no_io):
    job = prepare(target=SubmitTarget("kuberay", K8S), run="q4-a")
    assert job.address == job.record["address"] == K8S and job.record["backend"] == "kuberay"
    assert job.in_cluster_address == SERVICE and job.runtime_env["env_vars"]["RAY_ADDRESS"] == SERVICE
    assert job.check_data is True
    assert prepare(target=SubmitTarget("kuberay", K8S), run="q4-a", check_data=False).check_data is False
    assert prepare(run="q4-a").check_data is False  # an --address head: only on request
    assert prepare(run="q4-a", check_data=True).check_data is True
    svc = prepare(target=SubmitTarget("kuberay", SERVICE), run="q4-a")
    assert svc.in_cluster_address == SERVICE and svc.record["address"] == SERVICE


def test_kube_context_and_kubeconfig_are_recorded(no_io):
    cfg = config(kube_context="gpu-ctx", kubeconfig="/etc/kube/config")
    rec = prepare(cfg, SubmitTarget("kuberay", K8S), run="q4-a").record
    assert (rec["kube_context"], rec["kubeconfig"]) == ("gpu-ctx", "/etc/kube/config")


def test_launcher_mode_here_or_as_a_polyaxon_job(no_io):
    cfg = config(image=IMAGE)
    recipe, plan = BUILTIN["Qwen3-4B"], plan_split(BUILTIN["Qwen3-4B"], 2, 8)
    here = prepare(cfg, run="l-1", mode="launcher")
    argv = launcher_argv(cfg, recipe, plan, "/mnt/miles/runs/l-1", "l-1", [])
    assert here.kind == "launcher-exec" and here.launcher_argv == argv and here.entrypoint == " ".join(argv)
    assert here.in_cluster_address == URL and here.operation is None and here.record["mode"] == "launcher"
    in_cluster = prepare(cfg, SubmitTarget("kuberay", K8S), run="l-1", mode="launcher", extra_args=["--x", "1"])
    assert in_cluster.kind == "launcher-polyaxon"
    assert in_cluster.operation == launcher_job_operation(cfg, recipe, plan, IMAGE, "l-1", "/mnt/miles/runs/l-1",
                                                          SERVICE, ["--x", "1"])
    with pytest.raises(ConfigError, match="an image is needed"):
        prepare(target=SubmitTarget("kuberay", K8S), mode="launcher")


def test_resume_reuses_the_output_dir_of_a_compatible_run(no_io):
    base = prepare(run="base-a")
    job = prepare(run="base-b", resume=base.record)
    assert job.output_dir == job.record["output_dir"] == "/mnt/miles/runs/base-a"
    assert job.resumed_from == job.record["resumed_from"] == "base-a"
    assert job.resume == ResumeTarget("/mnt/miles/runs/base-a", "/mnt/miles/runs/base-a/checkpoints", "base-a")
    assert "--load /mnt/miles/runs/base-a/checkpoints" in job.entrypoint
    assert job.record["load_dir"] == base.record["checkpoint_dir"] == "/mnt/miles/runs/base-a/checkpoints"
    other = prepare(config(nodes=4), run="base-c", resume=base.record, force=True)
    assert other.output_dir == "/mnt/miles/runs/base-a"
    with pytest.raises(ConfigError, match="different setup") as info:
        prepare(config(nodes=4), run="base-c", resume=base.record)
    assert "nodes 2 != 4" in str(info.value) and "--force" in str(info.value)
    with pytest.raises(ConfigError, match="recipe hash"):
        prepare(config(recipe="Qwen3.5-4B"), run="base-d", resume=base.record)


def test_an_existing_run_is_reconciled_or_refused(no_io):
    first = prepare(run="dup-1")
    again = prepare(run="dup-1", existing=first.record)
    assert again.existing == first.record and again.reconcile_error is None
    assert again.submission_id == first.submission_id
    with pytest.raises(ConfigError, match="already exists with a different request") as info:
        prepare(config(nodes=4), run="dup-1", existing=first.record)
    assert "nodes 2 != 4" in str(info.value) and "--resume-from dup-1" in str(info.value)
    with pytest.raises(ConfigError, match="already exists on another cluster"):
        prepare(target=SubmitTarget("address", "http://elsewhere:8265"), run="dup-1", existing=first.record)


def test_a_different_request_under_an_existing_run_name_is_refused_naming_what_differs(no_io):
    first = prepare(run="dup-2")
    with pytest.raises(ConfigError) as info:
        prepare(config(recipe="Qwen3.5-4B"), run="dup-2", existing=first.record)
    assert "recipe Qwen3-4B != Qwen3.5-4B" in str(info.value) and "new --run name" in str(info.value)
    with pytest.raises(ConfigError, match="mode direct != launcher"):
        prepare(run="dup-2", mode="launcher", existing=first.record)
    with pytest.raises(ConfigError, match="command line"):
        prepare(run="dup-2", extra_args=["--lr", "1e-6"], existing=first.record)
    with pytest.raises(ConfigError, match="image None != "):
        prepare(config(image=IMAGE), run="dup-2", existing=first.record)
    # whatever the state of its job (FAILED, STOPPED): the same request again is the run as it is
    assert prepare(run="dup-2", existing={**first.record, "ray_version": "2.49.0"}).existing is not None


def test_a_rehearsal_submitted_again_with_another_timeout_is_the_same_run(no_io):
    """--timeout says how long the rehearsal waits for its placement, not what it runs: re-running the same
    submit with or without it finds the run (the users' smoke sequence does this)."""
    first = prepare(run="dup-3", rehearse=True, timeout=600)
    assert "--timeout 600" in first.entrypoint
    again = prepare(run="dup-3", rehearse=True, existing=first.record)
    assert again.existing is not None and again.submission_id == first.submission_id
    with pytest.raises(ConfigError, match="command line"):  # what it runs still counts
        prepare(run="dup-3", rehearse=True, timeout=600, extra_args=["--debug-train-only"], existing=first.record)


def test_a_later_attempt_is_the_same_request_as_the_run_it_continues(no_io):
    """Attempt 2 of a run whose job was lost with its head resumes from the run's own checkpoints (resumed_from =
    the run, --load in its command line); submitting the run again as the user first did finds it, not a change."""
    first = prepare(run="att-1")
    attempt2 = prepare(run="att-1", resume=first.record)
    assert attempt2.record["resumed_from"] == "att-1" and "--load" in attempt2.entrypoint
    assert prepare(run="att-1", existing=attempt2.record).existing is not None
    with pytest.raises(ConfigError, match="nodes 2 != 4"):  # a different request still is one
        prepare(config(nodes=4), run="att-1", existing=attempt2.record)


def test_disaggregated_split_in_the_job(no_io):
    job = prepare(config(nodes=3, layout="disaggregated", rollout_nodes=1), run="dis-1")
    args = shlex.split(job.entrypoint)
    assert "--colocate" not in args and args[-2:] == ["--rollout-num-gpus", "8"]
    assert job.record["split"]["layout"] == "disaggregated" and job.metadata["layout"] == "disaggregated"


# -- bad input, before anything is looked up ---------------------------------------------------------

def test_bad_requests_are_refused(no_io):
    with pytest.raises(PlanError):
        validate_request(config(nodes=3), SubmitRequest())
    with pytest.raises(ConfigError, match="which runs recipe Qwen3-4B colocated; this plan is disaggregated"):
        validate_request(config(nodes=4, layout="disaggregated", rollout_nodes=2), SubmitRequest(mode="launcher"))
    with pytest.raises(ConfigError, match="supports at most 1 node"):
        validate_request(config(recipe="Qwen3-30B-A3B", nodes=2), SubmitRequest(mode="launcher"))
    # Gemma-4-31B: the launcher runs its debug layout on 1 node; the catalog's flags are its 2+ node job
    with pytest.raises(ConfigError, match="from 2 nodes on"):
        validate_request(config(recipe="Gemma-4-31B", nodes=1), SubmitRequest(mode="launcher"))
    assert validate_request(config(recipe="Gemma-4-31B", nodes=2), SubmitRequest(mode="launcher"))
    with pytest.raises(PlanError, match=r"\[layout-plannable\].*run_deepseek\.py"):
        validate_request(config(recipe="DeepSeek-V3", nodes=4), SubmitRequest())
    with pytest.raises(ConfigError, match="pin the image by digest|tag"):
        validate_request(config(image="radixark/miles:latest"), SubmitRequest())
    assert validate_request(config(image="radixark/miles:latest", allow_unpinned=True), SubmitRequest()).image
    for bad in ("Q4", "-a", "a" * 41, "a_b"):
        with pytest.raises(ConfigError, match="run name"):
            validate_request(config(), SubmitRequest(run=bad))


def test_credentials_are_refused_without_being_repeated(no_io):
    with pytest.raises(ConfigError, match="looks like a credential") as info:
        validate_request(config(), SubmitRequest(env=["HF_TOKEN=hf_abcdefabcdefabcdefabcdef"]))
    assert "hf_abcdef" not in str(info.value)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        validate_request(config(), SubmitRequest(env=["NOEQUALS"]))
    with pytest.raises(ConfigError, match="--extra-args passes --wandb-key"):
        validate_request(config(), SubmitRequest(extra_args=["--wandb-key", "x"]))
    with pytest.raises(ConfigError, match="--extra-args contains what looks like") as info:
        validate_request(config(), SubmitRequest(extra_args=["--note", "sk-abcdefabcdefabcdef12"]))
    assert "sk-abcdef" not in str(info.value)


# -- the head's Ray version ------------------------------------------------------------------------------

def test_the_heads_ray_version_is_recorded_or_refused(no_io):
    job = prepare(run="v-1")
    assert job.record["ray_version"] is None
    assert job.with_head_ray_version(config(), "2.60.0").record["ray_version"] == "2.60.0"
    assert job.record["ray_version"] is None  # the prepared job is not changed
    assert prepare(config(ray_version="2.60.0"), run="v-1").with_head_ray_version(
        config(ray_version="2.60.0"), None).record["ray_version"] == "2.60.0"
    with pytest.raises(Conflict, match="runs Ray 2.59.0 but the config says 2.60.0"):
        job.with_head_ray_version(config(ray_version="2.60.0"), "2.59.0")
    assert check_head_ray_version(None, None) is None


def test_rehearsal_hold_reaches_the_driver_and_needs_rehearse(no_io):
    job = prepare(rehearse=True, hold=300, timeout=90)
    argv = shlex.split(job.entrypoint)
    assert argv[argv.index("--hold") + 1] == "300" and argv[argv.index("--timeout") + 1] == "90"
    assert "--hold" not in shlex.split(prepare(rehearse=True).entrypoint)  # no hold unless asked
    with pytest.raises(ConfigError, match="--hold .* --rehearse only"):
        prepare(hold=30)


def test_launcher_mode_follows_the_layout_of_the_recipes_launcher(no_io):
    """run_qwen3_235b_a22b.py is disaggregated (8 trainer nodes, 64 rollout GPUs, whatever --num-nodes says); the
    others colocated (tests/unit/test_upstream_parity.py checks the catalog's layouts against the captures)."""
    big = "Qwen3-235B-A22B"
    assert validate_request(config(recipe=big, nodes=16), SubmitRequest(mode="launcher")).plan.layout == \
        "disaggregated"
    with pytest.raises(ConfigError) as info:
        validate_request(config(recipe=big, nodes=16, layout="colocated"), SubmitRequest(mode="launcher"))
    assert str(info.value).startswith("--mode launcher runs the upstream launcher scripts/run_qwen3_235b_a22b.py, "
                                      "which runs recipe Qwen3-235B-A22B disaggregated; this plan is colocated")
    with pytest.raises(ConfigError) as info:
        validate_request(config(recipe=big, nodes=24, rollout_nodes=8), SubmitRequest(mode="launcher"))
    assert "on its own split (8 trainer node(s), 64 rollout GPUs) whatever --num-nodes says; this plan is 16 " \
           "trainer node(s), 64 rollout GPUs" in str(info.value)
    assert "--nodes 16 --layout disaggregated --rollout-gpus 64" in info.value.hint
    # direct mode takes both
    validate_request(config(recipe=big, nodes=16, layout="colocated"), SubmitRequest())
    validate_request(config(recipe=big, nodes=24, rollout_nodes=8), SubmitRequest())
