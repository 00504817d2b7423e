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
    ("recipes:\n  - name: x\n", "megatron_model_type.*Field required"),
    (GOOD.replace("tensor_parallel: 2", "tensor_parallel: two"), "tensor_parallel.*valid integer"),
    (GOOD.replace("attention_heads: 32", "attention_heads: 32\n    colour: red"), "colour.*Extra inputs"),
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
