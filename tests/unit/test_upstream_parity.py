"""Direct mode = what the upstream Miles launcher submits.

tests/data/upstream_miles/<commit>/<recipe>-<nodes>n.json hold what each catalog recipe's upstream launcher
(radixark/miles at the catalog's pinned commit) submits for that size: captured by tools/capture_upstream_jobs.py,
which runs the launcher's own job-building code with its command execution replaced by a recorder. For every
recipe and size, the job ``submit`` prepares in direct mode (through the real prepare step, with the submitting
environment the capture ran in) must equal it: the train.py argv exactly and in order once the split flags the
planner sets are set aside, the split flags themselves, and the runtime env apart from miles-ray's own values.
No Miles checkout is needed here."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.errors import PlanError
from miles_ray.core.recipes import BUILTIN, SPLIT_FLAGS, UPSTREAM_MILES_COMMIT
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request

DATA = Path(__file__).resolve().parents[1] / "data" / "upstream_miles" / UPSTREAM_MILES_COMMIT[:7]
# What miles-ray adds to the job's runtime env beyond the launcher's (on an existing KubeRay head: Kubernetes service
# env, the memory monitor; RAY_ADDRESS) -- besides the user's own env.
MILES_RAY_ENV = ("MILES_SCRIPT_EXTERNAL_RAY", "PROMETHEUS_PORT", "RAY_memory_monitor_refresh_ms", "RAY_ADDRESS")
CAPTURES = sorted(DATA.glob("*.json"))
URL = "http://10.0.0.5:8265"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def split_aside(argv: list[str]) -> tuple[list[str], dict[str, str | None]]:
    """(argv without the split flags, {split flag: value})."""
    rest, split, i = [], {}, 0
    while i < len(argv):
        n = SPLIT_FLAGS.get(argv[i])
        if n is None:
            rest.append(argv[i])
            i += 1
        else:
            assert argv[i] not in split, f"{argv[i]} given twice"
            split[argv[i]] = argv[i + 1] if n else None
            i += 1 + n
    return rest, split


def effective(split: dict[str, str | None], gpus_per_node: int) -> dict[str, str | None]:
    """The split Miles runs with (miles/utils/arguments.py): its defaults for an omitted flag (8 GPUs per node and
    per actor node, 1 GPU per engine) and, colocated, rollout on every trainer GPU whatever --rollout-num-gpus says.
    Launchers differ only in which of these they spell out; direct mode spells out all but the colocated one."""
    out = {"--num-gpus-per-node": "8", "--actor-num-gpus-per-node": "8", "--rollout-num-gpus-per-engine": "1", **split}
    if "--colocate" in out:
        out.pop("--rollout-num-gpus", None)
    assert out["--num-gpus-per-node"] == str(gpus_per_node), "the capture ran on nodes of another size"
    return out


def in_launcher_range(recipe, nodes: int) -> bool:
    return (recipe.launcher_min_nodes or 1) <= nodes <= (recipe.launcher_max_nodes or nodes)


def our_job(cap: dict):
    paths = cap["paths"]
    mount = "/capture"
    assert all(paths[k].startswith(mount + "/") for k in ("model_dir", "data_dir", "output_dir"))
    cfg = load_config({"name": "parity", "nodes": cap["nodes"], "gpus_per_node": cap["gpus_per_node"],
                       "recipe": cap["recipe"], "mount_path": mount, "models_dir": "models",
                       "datasets_dir": "datasets", "runs_dir": "outputs", "miles_root": paths["miles_root"],
                       "megatron_path": cap["launcher_argv"][cap["launcher_argv"].index("--megatron-path") + 1]},
                      environ={})
    valid = validate_request(cfg, SubmitRequest(run=paths["run_id"]))
    return prepare_submit(cfg, valid, SubmitTarget("address", URL), created="2026-08-22T00:00:00+00:00",
                          launchers_dir="/unused", environ=cap["submit_env"])


def test_every_catalog_recipe_is_captured_at_the_pinned_commit():
    assert len(UPSTREAM_MILES_COMMIT) == 40 and DATA.is_dir()
    names = {p.name for p in CAPTURES}
    for recipe in BUILTIN.values():
        if not recipe.capturable:
            continue
        for n in sorted({1, 2, 4, *recipe.capture_nodes}):
            assert f"{recipe.name}-{n}n.json" in names, f"no capture of {recipe.name} on {n} node(s)"
    for path in CAPTURES:
        cap = load(path)
        assert cap["upstream_commit"] == UPSTREAM_MILES_COMMIT
        assert cap["made_by"].startswith("tools/capture_upstream_jobs.py ")


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_direct_job_equals_the_upstream_launchers(path):
    cap = load(path)
    recipe = BUILTIN[cap["recipe"]]
    if cap["refused"]:
        # The launcher has no layout for this size; our catalog says so (launcher mode refuses it too).
        assert not in_launcher_range(recipe, cap["nodes"]), cap["refused"]
        return
    theirs_rest, theirs_split = split_aside(cap["entrypoint_argv"])
    if not in_launcher_range(recipe, cap["nodes"]):
        # Below/above the sizes the catalog says: the launcher submits another layout here (a debug run, its own
        # fixed node count), so its flags are not the catalog's -- and the catalog's range is not too narrow.
        catalog = [*recipe.model_args, *recipe.train_args]
        assert (theirs_rest[2:] != [t.replace("{model_dir}", cap["paths"]["model_dir"]) for t in catalog]
                or theirs_split.get("--actor-num-nodes") != str(cap["nodes"])), "the launcher's own layout"
        return
    try:
        job = our_job(cap)
    except PlanError as e:
        if recipe.default_layout == "disaggregated":
            # The launcher ignores --num-nodes and submits its own fixed split; the planner refuses the size.
            need = (int(theirs_split["--actor-num-nodes"])
                    + int(theirs_split["--rollout-num-gpus"]) // cap["gpus_per_node"])
            assert cap["nodes"] < need and "infeasible" in str(e)
        else:
            # The launcher submits a colocated job on this size that Megatron cannot lay out (e.g. TP*PP*CP = 256
            # on 8 GPUs); the planner refuses it with a divisibility rule instead of submitting it.
            assert theirs_split.get("--actor-num-nodes") == str(cap["nodes"]) and "--colocate" in theirs_split
            assert any(f"[{rule}]" in str(e) for rule in (
                "model-parallel-divides-trainer", "moe-parallel-divides-trainer", "gbs-divisible-by-dp")), e
        return
    ours_rest, ours_split = split_aside(shlex.split(job.entrypoint))
    assert ours_rest == theirs_rest
    assert effective(ours_split, cap["gpus_per_node"]) == effective(theirs_split, cap["gpus_per_node"])
    ours_env = {k: v for k, v in job.runtime_env["env_vars"].items() if k not in MILES_RAY_ENV}
    assert ours_env == cap["runtime_env"]["env_vars"]
    assert set(job.runtime_env) == set(cap["runtime_env"]) == {"env_vars"}
    assert job.runtime_env["env_vars"]["RAY_ADDRESS"] == URL


# captures launcher mode would run as is: not refused by the planner, within the launcher's node range (only
# these are generated, so every case asserts; the refused ones are checked by the parity test above)
LAUNCHED = [p for p in CAPTURES if not load(p)["refused"] and in_launcher_range(BUILTIN[load(p)["recipe"]],
                                                                                load(p)["nodes"])]


def test_most_captures_are_launched_as_is():
    assert len(LAUNCHED) >= len(CAPTURES) * 2 // 3, (len(LAUNCHED), len(CAPTURES))


@pytest.mark.parametrize("path", LAUNCHED, ids=[p.stem for p in LAUNCHED])
def test_catalog_layout_is_the_launchers(path):
    """Launcher mode trusts the recipe's default layout (and, disaggregated, its split) as the launcher's own."""
    cap = load(path)
    recipe = BUILTIN[cap["recipe"]]
    _, split = split_aside(cap["entrypoint_argv"])
    assert ("colocated" if "--colocate" in split else "disaggregated") == recipe.default_layout
    if recipe.default_layout == "disaggregated":
        assert (int(split["--actor-num-nodes"]), int(split["--rollout-num-gpus"])) == (
            recipe.default_actor_nodes, recipe.default_rollout_gpus)


def test_catalog_fields_agree_with_the_launchers_flags():
    """The planner reads the recipe's fields; the job carries the launcher's flags: they must be one truth."""
    for recipe in BUILTIN.values():
        if not recipe.train_args:
            continue
        flags = recipe.flag_values()
        if recipe.train_backend == "megatron":
            assert int(flags["--tensor-model-parallel-size"]) == recipe.tensor_parallel, recipe.name
            assert int(flags["--num-attention-heads"]) == recipe.attention_heads, recipe.name
        gbs = flags.get("--global-batch-size")  # else Miles derives it from --num-steps-per-rollout
        gbs = int(gbs) if gbs else recipe.samples_per_rollout // int(flags["--num-steps-per-rollout"])
        assert gbs == recipe.global_batch_size, recipe.name
        assert flags["--hf-checkpoint"].rstrip("/") == "{model_dir}/" + recipe.hf_dir, recipe.name
        assert flags.get("--ref-load") == (recipe.megatron_dir and "{model_dir}/" + recipe.megatron_dir), recipe.name
        assert flags["--prompt-data"] == "{data_dir}/" + recipe.train_data, recipe.name
        evals = [*recipe.train_args, None][recipe.train_args.index("--eval-prompt-data") + 2:][:1] \
            if "--eval-prompt-data" in recipe.train_args else [None]
        assert evals[0] == (recipe.eval_data and "{data_dir}/" + recipe.eval_data), recipe.name


def test_submitting_environment_is_read_only_for_the_launchers_keys():
    cap = load(DATA / "Qwen3-4B-1n.json")
    bare = dict(cap, submit_env={})
    env = our_job(bare).runtime_env["env_vars"]
    assert (env["MASTER_ADDR"], env["no_proxy"], env["PYTHONPATH"]) == (
        "127.0.0.1", "127.0.0.1,127.0.0.1", "/root/miles:/root/Megatron-LM")
    assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_DEBUG_FILE"} & set(env)
    noisy = dict(cap, submit_env={"NCCL_DEBUG_FILE": "/tmp/nccl.%h", "SECRET_THING": "x", "PYTHONPATH": "/a:/root/miles"})
    env = our_job(noisy).runtime_env["env_vars"]
    assert env["NCCL_DEBUG_FILE"] == "/tmp/nccl.%h" and "SECRET_THING" not in env
    assert env["PYTHONPATH"] == "/root/miles:/root/Megatron-LM:/a"  # appended, duplicates dropped
