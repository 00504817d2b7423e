"""Recipe catalog and user recipe files."""

from __future__ import annotations

import pytest

from miles_ray.core.errors import ConfigError
from miles_ray.core.recipes import BUILTIN, catalog, get_recipe, load_recipe_file

# the recipes of the upstream dense launcher, scripts/run_qwen3_dense.py
DENSE_LAUNCHER_RECIPES = ["Qwen3-4B", "Qwen3-32B", "Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B", "Qwen3.6-27B", "Qwen3.8-27B"]


def test_catalog_has_every_dense_launcher_recipe_a_moe_and_a_disaggregated_one() -> None:
    assert set(DENSE_LAUNCHER_RECIPES) <= set(BUILTIN)
    assert any(r.is_moe and r.expert_parallel > 1 for r in BUILTIN.values())
    assert any(r.default_layout == "disaggregated" for r in BUILTIN.values())
    q = BUILTIN["Qwen3-4B"]
    assert (q.tensor_parallel, q.rollout_gpus_per_engine, q.sglang_mem_fraction_static) == (2, 2, 0.7)
    assert (q.hf_dir, q.megatron_dir) == ("Qwen3-4B", "Qwen3-4B_torch_dist")
    assert q.global_batch_size == 256 and q.samples_per_rollout == 256
    assert BUILTIN["Qwen3-32B"].optimizer_cpu_offload and BUILTIN["Qwen3-32B"].tensor_parallel == 8


def test_hash_changes_with_content_only() -> None:
    q = BUILTIN["Qwen3-4B"]
    assert q.content_hash() == q.model_copy(update={"description": "x"}).content_hash()
    assert q.content_hash() != q.model_copy(update={"tensor_parallel": 4}).content_hash()


def test_unknown_recipe_suggests(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown recipe 'Qwen3-4b-x'.*did you mean") :
        get_recipe("Qwen3-4b-x")
    assert get_recipe("qwen3-4b").name == "Qwen3-4B"


GOOD = """
recipes:
  - name: MyModel-7B
    megatron_model_type: mymodel-7B
    hf_dir: MyModel-7B
    megatron_dir: MyModel-7B_torch_dist
    tensor_parallel: 2
    rollout_gpus_per_engine: 2
    attention_heads: 32
"""


def test_user_recipe_file(tmp_path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(GOOD)
    assert "MyModel-7B" in catalog(f)
    assert get_recipe("MyModel-7B", f).tensor_parallel == 2


@pytest.mark.parametrize("text, match", [
    ("recipes:\n  - name: x\n", "hf_dir: is required \\(and 2 more\\)"),
    (GOOD.replace("tensor_parallel: 2", "tensor_parallel: two"), "tensor_parallel.*must be a whole number"),
    (GOOD.replace("attention_heads: 32", "attention_heads: 32\n    colour: red"), "colour.*is not a known key"),
    (GOOD.replace("hf_dir: MyModel-7B", "hf_dir: ../../etc"), "hf_dir.*relative path"),
    (GOOD.replace("hf_dir: MyModel-7B", "hf_dir: /etc/passwd"), "hf_dir.*relative path"),
    ("recipes: []\n", "at least 1"),
    (GOOD + GOOD.replace("recipes:\n", ""), "defined twice"),
])
def test_bad_recipe_files(tmp_path, text: str, match: str) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_recipe_file(f)
    assert "\n" not in str(info.value)


def test_catalog_lists_every_upstream_launcher_at_the_pinned_commit() -> None:
    """scripts/run_*.py and scripts/amd/run_*.py at 31f1ca9 (the list is data from that commit): each is a
    recipe's launcher, planned or listed with the reason it is not."""
    upstream = {
        "run_deepseek.py", "run_deepseek_v32.py", "run_deepseek_v4.py", "run_gemma_4_26b_a4b.py", "run_gemma_4_31b.py",
        "run_glm45_355b_a32b.py", "run_glm45_355b_a32b_8node.py", "run_glm47_flash.py", "run_glm5_1_744b_a40b_lora.py",
        "run_glm5_2_744b_a40b.py", "run_glm5_2_744b_a40b_lora.py", "run_glm5_744b_a40b.py", "run_gpt_oss_20b.py",
        "run_inkling.py", "run_joy_ai_llm_flash.py", "run_kimi_k2.py", "run_kimi_k25.py", "run_mcore_fsdp.py",
        "run_nemotron_3_nano.py", "run_nemotron_3_nano_4b_fsdp.py", "run_nemotron_3_super_120b_a12b.py",
        "run_nemotron_3_ultra_550b_a55b.py", "run_qwen3_0_6b_fsdp.py", "run_qwen3_235b_a22b.py", "run_qwen3_30b_a3b.py",
        "run_qwen3_30b_a3b_fsdp.py", "run_qwen3_4b.py", "run_qwen3_4b_npu.py", "run_qwen3_5_35b_a3b_lora.py",
        "run_qwen3_5_35b_a3b_mtp.py", "run_qwen3_6_35b_a3b_mtp.py", "run_qwen3_dense.py", "run_qwen3_next_80b_a3b.py",
        "run_qwen3_sft.py", "amd/run_deepseek_v4.py", "amd/run_glm5_2_744b_a40b.py", "amd/run_inkling.py",
        "amd/run_qwen3_30b_a3b.py", "amd/run_qwen3_4b.py"}
    assert {r.launcher.removeprefix("scripts/") for r in BUILTIN.values()} == upstream
    for r in BUILTIN.values():
        assert r.plannable == (not r.not_plannable_reason), r.name
        assert r.plannable == bool(r.train_args), r.name  # planned recipes carry the launcher's captured job


@pytest.mark.parametrize("update, match", [
    ({"megatron_model_type": None}, "needs megatron_model_type"),
    ({"launcher_min_nodes": 4, "launcher_max_nodes": 2}, "launcher_min_nodes 4 > launcher_max_nodes 2"),
    ({"global_batch_size": 128}, "num-steps-per-rollout 4: global batch size is 128 x 8 / 4 = 256"),
])
def test_recipe_consistency_is_checked_on_load(update, match) -> None:
    k2 = BUILTIN["Kimi-K2"]  # passes --num-steps-per-rollout 4 and no --global-batch-size
    assert k2.global_batch_size == 256
    with pytest.raises(ValueError, match=match):
        type(k2).model_validate({**k2.model_dump(), **update})


def test_new_fields_at_their_defaults_leave_the_hash_alone() -> None:
    """Runs recorded before train_backend / launcher_min_nodes / not_planned existed keep resuming."""
    q = BUILTIN["Qwen3-4B"]
    payload = q.model_dump(exclude={"description", "train_backend", "launcher_min_nodes", "not_planned"})
    import hashlib
    import json
    old = "sha256:" + hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert q.content_hash() == old
    assert q.model_copy(update={"launcher_min_nodes": 2}).content_hash() != old
