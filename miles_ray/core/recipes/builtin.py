"""The built-in catalog: the upstream Miles launchers at the pinned commit, each as a recipe (values from the
launcher's code, flags from its capture in ``miles_ray.core.upstream_jobs``), or listed with why it is not planned."""

from __future__ import annotations

from miles_ray.core.recipes.model import Recipe
from miles_ray.core.upstream_jobs import JOBS

def _upstream(name: str) -> dict:
    """The captured upstream job data of a built-in recipe (miles_ray.core.upstream_jobs; none before the first
    capture of a new recipe, which test_upstream_parity refuses)."""
    return dict(JOBS.get(name, {}))


def _dense(name: str, model_type: str, tp: int, max_tokens: int, engine: int, mem: float, cpu_adam: bool,
           heads: int, num_rollout: int = 3000) -> Recipe:
    return Recipe(
        name=name,
        description=f"{name} dense GRPO (upstream scripts/run_qwen3_dense.py)",
        megatron_model_type=model_type,
        hf_dir=name,
        megatron_dir=f"{name}_torch_dist",
        tensor_parallel=tp,
        max_tokens_per_gpu=max_tokens,
        rollout_gpus_per_engine=engine,
        sglang_mem_fraction_static=mem,
        optimizer_cpu_offload=cpu_adam,
        attention_heads=heads,
        num_rollout=num_rollout,
        launcher_args=["--model-name", name],
        **_upstream(name),
    )


def _launched(name: str, launcher: str, description: str, **fields) -> Recipe:
    """A recipe of one upstream launcher (values from the launcher's code; flags from its capture)."""
    fields.setdefault("hf_dir", name)
    return Recipe(name=name, launcher=launcher, description=f"{description} (upstream {launcher})", **fields,
                  **_upstream(name))


def _listed(name: str, launcher: str, why: str, **fields) -> Recipe:
    """A launcher listed for completeness but not planned (``not_planned`` says why); never captured."""
    fields.setdefault("hf_dir", name)
    fields.setdefault("rollout_gpus_per_engine", 8)
    fields.setdefault("attention_heads", 64)
    return Recipe(name=name, launcher=launcher, description=f"{name} (upstream {launcher}): {why}", not_planned=why,
                  **fields)


# The other upstream launchers at the pinned commit. Static layouts are captured and planned; launchers whose
# layout changes with the node count (or that the planner cannot express) are listed with the reason.
_FAMILIES: tuple[Recipe, ...] = (
    _launched("Qwen3-4B-CP4", "scripts/run_qwen3_4b.py", "Qwen3-4B GRPO on H100, TP2 CP4, 1 GPU per engine",
              megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B", megatron_dir="Qwen3-4B_torch_dist",
              tensor_parallel=2, context_parallel=4, rollout_gpus_per_engine=1, attention_heads=32),
    _launched("Qwen3-4B-FSDP", "scripts/run_mcore_fsdp.py",
              "Qwen3-4B-Instruct-2507 GRPO with the FSDP backend (no ref model), colocated",
              train_backend="fsdp", hf_dir="Qwen3-4B-Instruct-2507", rollout_gpus_per_engine=1, attention_heads=32,
              global_batch_size=1024, rollout_batch_size=64, n_samples_per_prompt=16, max_tokens_per_gpu=32768,
              sglang_mem_fraction_static=0.75),
    _launched("Qwen3-30B-A3B-B200", "scripts/run_qwen3_30b_a3b.py",
              "Qwen3-30B-A3B MoE GRPO on B200 (1, 2 or 4 nodes): TP4, EP4, 4 GPUs per engine",
              megatron_model_type="qwen3-30B-A3B", hf_dir="Qwen3-30B-A3B", megatron_dir="Qwen3-30B-A3B_torch_dist",
              tensor_parallel=4, expert_parallel=4, rollout_gpus_per_engine=4, attention_heads=32, num_experts=128,
              max_tokens_per_gpu=32768, launcher_max_nodes=4,
              launcher_args=["--model-name", "Qwen3-30B-A3B", "--hardware", "B200"]),
    _launched("Qwen3.5-35B-A3B-MTP", "scripts/run_qwen3_5_35b_a3b_mtp.py",
              "Qwen3.5-35B-A3B MoE GRPO with MTP training and speculative rollout on H200: TP2 CP2 EP8",
              megatron_model_type="qwen3.5-35B-A3B", hf_dir="Qwen3.5-35B-A3B",
              megatron_dir="Qwen3.5-35B-A3B_torch_dist", tensor_parallel=2,
              context_parallel=2, expert_parallel=8, rollout_gpus_per_engine=8, attention_heads=16, num_experts=256,
              max_tokens_per_gpu=8192, optimizer_cpu_offload=True, eval_data=None),
    _launched("Qwen3.6-35B-A3B-MTP", "scripts/run_qwen3_6_35b_a3b_mtp.py",
              "Qwen3.6-35B-A3B MoE GRPO with MTP on H200 (the launcher's short default run): EP8",
              megatron_model_type="qwen3.6-35B-A3B", hf_dir="Qwen3.6-35B-A3B",
              megatron_dir="Qwen3.6-35B-A3B_torch_dist", expert_parallel=8,
              rollout_gpus_per_engine=8, attention_heads=16, num_experts=256, max_tokens_per_gpu=8192,
              global_batch_size=16, rollout_batch_size=8, n_samples_per_prompt=2, num_rollout=10,
              optimizer_cpu_offload=True, eval_data=None),
    _launched("Qwen3.5-35B-A3B-LoRA", "scripts/run_qwen3_5_35b_a3b_lora.py",
              "Qwen3.5-35B-A3B LoRA GRPO on gsm8k, one node (the launcher ignores --num-nodes)",
              launcher_args=["train"], megatron_model_type="qwen3.5-35B-A3B_lora", hf_dir="Qwen3.5-35B-A3B",
              tensor_parallel=2, expert_parallel=8, max_tokens_per_gpu=4096, rollout_gpus_per_engine=8, attention_heads=16, num_experts=256,
              global_batch_size=64, rollout_batch_size=8, n_samples_per_prompt=8, num_rollout=10,
              sglang_mem_fraction_static=0.4, train_data="gsm8k/train.parquet", eval_data=None,
              launcher_max_nodes=1),
    _launched("Qwen3-Next-80B-A3B", "scripts/run_qwen3_next_80b_a3b.py",
              "Qwen3-Next-80B-A3B-Thinking GRPO, the launcher's 4-node topology: TP2 PP4 CP2 EP8, MTP",
              megatron_model_type="qwen3-next-80B-A3B", hf_dir="Qwen3-Next-80B-A3B-Thinking",
              megatron_dir="Qwen3-Next-80B-A3B-Thinking_torch_dist", tensor_parallel=2, pipeline_parallel=4,
              context_parallel=2, expert_parallel=8, rollout_gpus_per_engine=8, attention_heads=16, num_experts=512,
              max_tokens_per_gpu=8192, sglang_mem_fraction_static=0.8, optimizer_cpu_offload=True,
              launcher_min_nodes=4, launcher_max_nodes=4),
    _launched("GLM-4.7-Flash", "scripts/run_glm47_flash.py", "GLM-4.7-Flash MoE GRPO on H200: TP4 EP8",
              megatron_model_type="glm4.7-flash", megatron_dir="GLM-4.7-Flash_torch_dist", tensor_parallel=4,
              expert_parallel=8, rollout_gpus_per_engine=1, attention_heads=20, num_experts=64,
              max_tokens_per_gpu=32768, optimizer_cpu_offload=True),
    _launched("GLM-4.7-Flash-B200", "scripts/run_glm47_flash.py",
              "GLM-4.7-Flash MoE GRPO on B200: TP4 EP8, 2 GPUs per engine",
              megatron_model_type="glm4.7-flash", hf_dir="GLM-4.7-Flash", megatron_dir="GLM-4.7-Flash_torch_dist",
              tensor_parallel=4, expert_parallel=8, rollout_gpus_per_engine=2, attention_heads=20, num_experts=64,
              max_tokens_per_gpu=32768, optimizer_cpu_offload=True, launcher_args=["--hardware", "B200"]),
    _launched("GLM-4.5-355B-A32B", "scripts/run_glm45_355b_a32b_8node.py",
              "GLM-4.5-355B-A32B MoE GRPO on 8 nodes (the launcher's fixed size): TP8 PP4 CP2 EP16, 32 GPUs per engine",
              megatron_model_type="glm4.5-355B-A32B", megatron_dir="GLM-4.5-355B-A32B_torch_dist", tensor_parallel=8,
              pipeline_parallel=4, context_parallel=2, expert_parallel=16, rollout_gpus_per_engine=32,
              attention_heads=96, num_experts=160, rollout_batch_size=128, max_tokens_per_gpu=16384,
              optimizer_cpu_offload=True, launcher_min_nodes=8, launcher_max_nodes=8, capture_nodes=[8]),
    _launched("gpt-oss-20b", "scripts/run_gpt_oss_20b.py",
              "gpt-oss-20b MoE GRPO in bridge mode (HF weights, no --ref-load): TP8 EP8, 4 GPUs per engine",
              megatron_model_type="gpt-oss-20b", tensor_parallel=8, expert_parallel=8, rollout_gpus_per_engine=4,
              attention_heads=64, num_experts=32, num_rollout=1000, optimizer_cpu_offload=True, eval_data=None),
    _launched("Gemma-4-26B-A4B", "scripts/run_gemma_4_26b_a4b.py",
              "Gemma 4 26B-A4B MoE GRPO in bridge mode on H200: TP4 EP8, 4 GPUs per engine (1 node: the launcher's "
              "debug run)", launcher_args=["train"], megatron_model_type="gemma-4-26b-a4b-it",
              hf_dir="gemma-4-26B-A4B-it", megatron_dir="gemma-4-26B-A4B-it", tensor_parallel=4, expert_parallel=8,
              rollout_gpus_per_engine=4, attention_heads=16, num_experts=128, max_tokens_per_gpu=1024,
              sglang_mem_fraction_static=0.55, eval_data=None, launcher_min_nodes=2),
    _launched("Gemma-4-31B", "scripts/run_gemma_4_31b.py",
              "Gemma 4 31B dense GRPO in bridge mode on H200: TP4, 4 GPUs per engine (1 node: the launcher's debug "
              "run)", launcher_args=["train"], megatron_model_type="gemma-4-31b-it", hf_dir="gemma-4-31B-it",
              megatron_dir="gemma-4-31B-it", tensor_parallel=4, rollout_gpus_per_engine=4, attention_heads=32,
              max_tokens_per_gpu=512, sglang_mem_fraction_static=0.5, optimizer_cpu_offload=True, eval_data=None,
              launcher_min_nodes=2),
    _launched("Kimi-K2", "scripts/run_kimi_k2.py",
              "Kimi-K2-Instruct MoE GRPO: TP8 PP8 (last stage 5 layers) CP4 EP32, 16 GPUs per engine; 32 nodes",
              megatron_model_type="kimi-k2", hf_dir="Kimi-K2-Instruct", megatron_dir="Kimi-K2_torch_dist",
              tensor_parallel=8, pipeline_parallel=8, context_parallel=4, expert_parallel=32,
              rollout_gpus_per_engine=16, attention_heads=64, num_experts=384, rollout_batch_size=128,
              max_tokens_per_gpu=16384, num_rollout=100, optimizer_cpu_offload=True, capture_nodes=[32]),
    _launched("Kimi-K2.5", "scripts/run_kimi_k25.py",
              "Kimi-K2.5 MoE GRPO on H200: TP8 PP8 (last stage 5 layers) CP4 EP32, 8 GPUs per engine; 32 nodes "
              "(1 node: the launcher's 2-layer test)", launcher_args=["train"], megatron_model_type="kimi-k25",
              megatron_dir="Kimi-K2.5-bf16", max_tokens_per_gpu=4096, tensor_parallel=8, pipeline_parallel=8, context_parallel=4,
              expert_parallel=32, rollout_gpus_per_engine=8, attention_heads=64, num_experts=384,
              optimizer_cpu_offload=True, eval_data=None, launcher_min_nodes=2, capture_nodes=[32]),
    _launched("Nemotron-3-Nano-4B", "scripts/run_nemotron_3_nano.py",
              "NVIDIA Nemotron 3 Nano 4B (BF16) GRPO in bridge mode: TP2 PP2, 1 GPU per engine",
              megatron_model_type="nemotron-3-nano-4b", hf_dir="NVIDIA-Nemotron-3-Nano-4B-BF16",
              megatron_dir="NVIDIA-Nemotron-3-Nano-4B-BF16", tensor_parallel=2, pipeline_parallel=2,
              rollout_gpus_per_engine=1, attention_heads=40, num_rollout=10, eval_data=None),
    _launched("Nemotron-3-Nano-30B-A3B", "scripts/run_nemotron_3_nano.py",
              "NVIDIA Nemotron 3 Nano 30B-A3B (BF16) MoE GRPO in bridge mode",
              launcher_args=["--model-name", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"],
              megatron_model_type="nemotron-3-nano-30b-a3b", hf_dir="NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
              megatron_dir="NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", tensor_parallel=2, pipeline_parallel=2,
              expert_parallel=2, rollout_gpus_per_engine=1, attention_heads=32, num_experts=128,
              global_batch_size=128, n_samples_per_prompt=4, max_tokens_per_gpu=1024, num_rollout=10,
              eval_data=None),
    _listed("Nemotron-3-Super-120B-A12B", "scripts/run_nemotron_3_super_120b_a12b.py",
            "a two-role script (train starts the Ray head, worker joins it) that sets the job's MASTER_ADDR to its "
            "own --head-ip (default 127.0.0.1), not the head miles-ray submits to; its layout (TP4 PP2 EP8, 8 GPUs "
            "per engine) fits a recipe file", megatron_model_type="nemotron-3-super-120b-a12b",
            hf_dir="NVIDIA-Nemotron-3-Super-120B-A12B-BF16", tensor_parallel=4, pipeline_parallel=2,
            expert_parallel=8, attention_heads=32, num_experts=512, global_batch_size=128, n_samples_per_prompt=4),
    _launched("Nemotron-3-Ultra-550B-A55B", "scripts/run_nemotron_3_ultra_550b_a55b.py",
              "NVIDIA Nemotron 3 Ultra 550B-A55B MoE GRPO on H200, 16 nodes only (the launcher's one preset): "
              "TP8 PP4 EP32, 32 GPUs per engine", launcher_args=["train"],
              megatron_model_type="nemotron-3-ultra-550b-a55b", hf_dir="NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
              megatron_dir="NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", tensor_parallel=8, pipeline_parallel=4,
              expert_parallel=32, rollout_gpus_per_engine=32, attention_heads=64, num_experts=512,
              global_batch_size=128, max_tokens_per_gpu=1024, num_rollout=30, optimizer_cpu_offload=True,
              eval_data=None, launcher_min_nodes=16, launcher_max_nodes=16, capture_nodes=[16]),
    # Listed, not planned.
    _listed("DeepSeek-V3", "scripts/run_deepseek.py",
            "TP, PP, EP and GPUs per engine change with the node count (TP1 on 1-2 nodes, TP4 on 4, PP4 EP16 and "
            "64-GPU engines from 8)", megatron_model_type="deepseek-v3", num_experts=256, expert_parallel=4,
            rollout_gpus_per_engine=4, attention_heads=128),
    _listed("DeepSeek-V3.2", "scripts/run_deepseek_v32.py",
            "the launcher takes its split from --actor-num-nodes / --rollout-num-gpus or --use-single-node, not "
            "--num-nodes (without them it submits '--actor-num-nodes None')", megatron_model_type="deepseek-v32",
            num_experts=256, expert_parallel=16, attention_heads=128),
    _listed("DeepSeek-V4", "scripts/run_deepseek_v4.py",
            "per-size presets of different models (a 4-layer cut on 1 node, V4-Flash on 8, V4-Pro on 32 nodes); "
            "other sizes are refused", megatron_model_type="deepseek-v4-flash", rollout_gpus_per_engine=4),
    _listed("GLM-4.5-355B-A32B-scaling", "scripts/run_glm45_355b_a32b.py",
            "PP, CP, EP and GPUs per engine change with the node count (engines of 8/16/32 GPUs on 1/2/4 nodes, "
            "PP8 CP2 on 8, PP4 CP2 from 16); its default hardware is GB200 (4 GPUs per node)",
            megatron_model_type="glm4.5-355B-A32B", num_experts=160, expert_parallel=4, attention_heads=96),
    _listed("GLM-5-744B-A40B", "scripts/run_glm5_744b_a40b.py",
            "a 4-layer cut of the model on 1 node, the full model from 16 nodes, other sizes refused",
            megatron_model_type="glm5-744B-A40B", attention_heads=64),
    _listed("GLM-5.2-744B-A40B", "scripts/run_glm5_2_744b_a40b.py",
            "a 5-layer cut of the model on 1 node, the full model from 16 nodes, other sizes refused",
            megatron_model_type="glm5.2-744B-A40B", attention_heads=64),
    _listed("GLM-5.1-744B-A40B-LoRA", "scripts/run_glm5_1_744b_a40b_lora.py",
            "a one-node LoRA smoke test of a 6-layer cut of the model by default (the full model needs its own "
            "--model-name and sizes); the launcher ignores --num-nodes", megatron_model_type="glm5.1-744B-A40B_lora",
            attention_heads=64),
    _listed("GLM-5.2-744B-A40B-LoRA", "scripts/run_glm5_2_744b_a40b_lora.py",
            "a one-node LoRA smoke test of a 5-layer cut of the model by default; the launcher ignores --num-nodes",
            megatron_model_type="glm5.2-744B-A40B_lora", attention_heads=64),
    _listed("Inkling", "scripts/run_inkling.py",
            "presets only for 4-GPU (GB200/GB300-class) nodes and chosen sizes (fully-async variants); none for "
            "8-GPU nodes", megatron_model_type="inkling", rollout_gpus_per_engine=16),
    _listed("JoyAI-LLM-Flash", "scripts/run_joy_ai_llm_flash.py",
            "B200 only, and it splits one node in halves (4 trainer + 4 rollout GPUs) whatever --num-nodes says; "
            "the planner keeps the trainer on whole nodes", megatron_model_type="joyai-llm-flash",
            rollout_gpus_per_engine=1),
    _listed("Qwen3-4B-SFT", "scripts/run_qwen3_sft.py",
            "supervised fine-tuning (--debug-train-only, no rollout) on one node whatever --num-nodes says; the "
            "planner plans RL splits", megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B-Base",
            rollout_gpus_per_engine=1, attention_heads=32),
    _listed("Qwen3-0.6B-FSDP", "scripts/run_qwen3_0_6b_fsdp.py",
            "an FSDP curve test for 4-GPU nodes without --megatron-path/--run-id options (launcher mode cannot "
            "drive it)", train_backend="fsdp", hf_dir="Qwen3-0.6B", rollout_gpus_per_engine=1, attention_heads=16),
    _listed("Qwen3-30B-A3B-FSDP", "scripts/run_qwen3_30b_a3b_fsdp.py",
            "an FSDP curve test for 4-GPU nodes without --megatron-path/--run-id options (launcher mode cannot "
            "drive it)", train_backend="fsdp", hf_dir="Qwen3-30B-A3B", rollout_gpus_per_engine=1,
            attention_heads=32),
    _listed("Nemotron-3-Nano-4B-FSDP", "scripts/run_nemotron_3_nano_4b_fsdp.py",
            "an FSDP curve test for 4-GPU nodes without --megatron-path/--run-id options (launcher mode cannot "
            "drive it)", train_backend="fsdp", hf_dir="NVIDIA-Nemotron-3-Nano-4B-BF16", rollout_gpus_per_engine=1,
            attention_heads=40),
)


# Values from radixark/miles scripts/run_qwen3_dense.py (_RECIPES) and scripts/models/*.sh (heads).
BUILTIN: dict[str, Recipe] = {
    r.name: r
    for r in (
        _dense("Qwen3-4B", "qwen3-4B", 2, 9216, 2, 0.7, False, heads=32),
        _dense("Qwen3-32B", "qwen3-32B", 8, 20480, 8, 0.7, True, heads=64, num_rollout=5),
        _dense("Qwen3.5-4B", "qwen3.5-4B", 2, 9216, 1, 0.7, False, heads=16),
        _dense("Qwen3.5-9B", "qwen3.5-9B", 2, 9216, 1, 0.6, False, heads=16),
        _dense("Qwen3.5-27B", "qwen3.5-27B", 4, 8192, 1, 0.5, True, heads=24),
        _dense("Qwen3.6-27B", "qwen3.6-27B", 4, 8192, 1, 0.5, True, heads=24),
        _dense("Qwen3.8-27B", "qwen3.8-27B", 4, 8192, 1, 0.8, True, heads=24),
        Recipe(
            name="Qwen3-30B-A3B",
            description="Qwen3-30B-A3B MoE GRPO on H100 (upstream scripts/run_qwen3_30b_a3b.py): TP4, EP8",
            launcher="scripts/run_qwen3_30b_a3b.py",
            megatron_model_type="qwen3-30B-A3B",
            hf_dir="Qwen3-30B-A3B",
            megatron_dir="Qwen3-30B-A3B_torch_dist",
            tensor_parallel=4,
            expert_parallel=8,
            rollout_gpus_per_engine=8,
            attention_heads=32,
            num_experts=128,
            max_tokens_per_gpu=32768,
            optimizer_cpu_offload=True,
            launcher_max_nodes=1,  # the upstream launcher implements H100 x 1 node only
            launcher_args=["--model-name", "Qwen3-30B-A3B"],
            **_upstream("Qwen3-30B-A3B"),
        ),
        Recipe(
            name="Qwen3-235B-A22B",
            description=(
                "Qwen3-235B-A22B MoE GSPO, disaggregated (upstream scripts/run_qwen3_235b_a22b.py): "
                "8 trainer nodes TP4/PP4/CP2/EP16, 64 rollout GPUs, 32 GPUs per engine, FP8 rollout weights"
            ),
            launcher="scripts/run_qwen3_235b_a22b.py",
            megatron_model_type="qwen3-235B-A22B",
            hf_dir="Qwen3-235B-A22B-FP8",
            megatron_dir="Qwen3-235B-A22B_torch_dist",
            tensor_parallel=4,
            pipeline_parallel=4,
            context_parallel=2,
            expert_parallel=16,
            rollout_gpus_per_engine=32,
            attention_heads=64,
            num_experts=128,
            max_tokens_per_gpu=16384,
            global_batch_size=64,
            rollout_batch_size=8,
            optimizer_cpu_offload=True,
            default_layout="disaggregated",
            default_actor_nodes=8,
            default_rollout_gpus=64,
            launcher_args=["--model-name", "Qwen3-235B-A22B"],
            capture_nodes=[16],
            **_upstream("Qwen3-235B-A22B"),
        ),
        *_FAMILIES,
        # Launchers for hardware miles-ray cannot plan: listed and marked, refused by plan and submit.
        Recipe(
            name="Qwen3-4B-AMD",
            description="Qwen3-4B GRPO on AMD MI350X/MI355X (upstream scripts/amd/run_qwen3_4b.py)",
            launcher="scripts/amd/run_qwen3_4b.py", megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B",
            megatron_dir="Qwen3-4B_torch_dist", tensor_parallel=2, rollout_gpus_per_engine=2, attention_heads=32,
            hardware="amd", hardware_note="ROCm on MI350X/MI355X", launcher_args=["--hardware", "MI355X"],
        ),
        Recipe(
            name="Qwen3-30B-A3B-AMD",
            description="Qwen3-30B-A3B MoE GRPO on AMD MI350X/MI355X (upstream scripts/amd/run_qwen3_30b_a3b.py)",
            launcher="scripts/amd/run_qwen3_30b_a3b.py", megatron_model_type="qwen3-30B-A3B",
            hf_dir="Qwen3-30B-A3B", megatron_dir="Qwen3-30B-A3B_torch_dist", tensor_parallel=1, expert_parallel=4,
            rollout_gpus_per_engine=2, attention_heads=32, num_experts=128, max_tokens_per_gpu=16384,
            hardware="amd", hardware_note="ROCm on MI350X/MI355X", launcher_args=["--hardware", "MI355X"],
            launcher_max_nodes=1,
        ),
        *(Recipe(name=name, description=f"{name} on AMD MI350X/MI355X (upstream {launcher})", launcher=launcher,
                 megatron_model_type=model, hf_dir=name, rollout_gpus_per_engine=8, attention_heads=64,
                 hardware="amd", hardware_note="ROCm on MI350X/MI355X")
          for name, launcher, model in (
              ("DeepSeek-V4-AMD", "scripts/amd/run_deepseek_v4.py", "deepseek-v4-flash"),
              ("GLM-5.2-744B-A40B-AMD", "scripts/amd/run_glm5_2_744b_a40b.py", "glm5.2-744B-A40B"),
              ("Inkling-AMD", "scripts/amd/run_inkling.py", "inkling"))),
        Recipe(
            name="Qwen3-4B-NPU",
            description="Qwen3-4B GRPO on Ascend NPU (upstream scripts/run_qwen3_4b_npu.py)",
            launcher="scripts/run_qwen3_4b_npu.py", megatron_model_type="qwen3-4B", hf_dir="Qwen3-4B",
            megatron_dir="Qwen3-4B_torch_dist", tensor_parallel=4, rollout_gpus_per_engine=1, attention_heads=32,
            max_tokens_per_gpu=4096, sglang_mem_fraction_static=0.6, hardware="npu", hardware_note="Ascend NPU",
        ),
    )
}

DENSE_LAUNCHER = "scripts/run_qwen3_dense.py"
