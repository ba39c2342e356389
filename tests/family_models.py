"""Tiny random-weight checkpoints of every mlx-lm family, built by mlx-lm itself.

`make_family_model(path, family)` instantiates mlx-lm's own ``Model`` class for
the family's ``model_type`` from a small config, fills its parameters with
seeded random values, and saves them with mlx-lm's ``save_model`` (the layout
of an mlx-community checkpoint), with config.json and the byte-level BPE
tokenizer of tests/tiny_models.py. Model types transformers does not know get
a configuration class in the directory and an ``auto_map`` (as their hub
checkpoints ship), so vLLM needs ``trust_remote_code``.

Weights: linears N(0, gain^2 / fan_in), embeddings and untied heads N(0, 1) rows
(logit std ~ sqrt(hidden)), norms near 1, biases small. Special and non-ASCII
byte tokens are damped in the output rows so runs are not cut short by EOS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.tiny_models import (BOS, EOS, PAD, _damped_ids, _train_tokenizer, _write_json,
                               cached_build)

VOCAB = 1024
HIDDEN = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
INTER = 512
MAX_POS = 4096
# Small enough that short test prompts cross it.
WINDOW = 16
MOE_EXPERTS = 4
MOE_INTER = 128
MLA_RANK = 64
# Gated DeltaNet mixers: 4 value heads over 2 key heads, a 4-tap short conv.
_GDN = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4)

_DIMS = dict(hidden_size=HIDDEN, num_hidden_layers=2, intermediate_size=INTER,
             num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
             vocab_size=VOCAB, max_position_embeddings=MAX_POS, rms_norm_eps=1e-6,
             rope_theta=10000.0)

# family -> (HF architecture, config keys beyond _DIMS). Each is the smallest
# config that turns on the family's distinct features (windows, fused
# projections, q/k norms, logit transforms).
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "mistral": ("MistralForCausalLM", dict(tie_word_embeddings=True)),
    "ministral3": ("Ministral3ForCausalLM", dict(
        num_hidden_layers=4, sliding_window=WINDOW, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0,
                             original_max_position_embeddings=1024, llama_4_scaling_beta=0.1,
                             beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", dict(tie_word_embeddings=False)),
    "gemma": ("GemmaForCausalLM", dict()),
    "gemma2": ("Gemma2ForCausalLM", dict(query_pre_attn_scalar=48, attn_logit_softcapping=5.0,
                                         final_logit_softcapping=8.0)),
    "gemma3_text": ("Gemma3ForCausalLM", dict(
        num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2,
        query_pre_attn_scalar=48, rope_local_base_freq=10000.0, rope_theta=1e6)),
    # The language model of a multimodal checkpoint, served text-only.
    "gemma3": ("Gemma3ForConditionalGeneration", dict(text_config=dict(
        model_type="gemma3_text", **{k: v for k, v in _DIMS.items()
                                      if k not in ("vocab_size", "num_hidden_layers")},
        num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2,
        query_pre_attn_scalar=48, rope_local_base_freq=10000.0))),
    # KV-shared layers, per-layer inputs, proportional partial RoPE on global layers.
    "gemma4_text": ("Gemma4ForCausalLM", dict(
        num_hidden_layers=6, sliding_window=WINDOW, sliding_window_pattern=3,
        global_head_dim=HEAD_DIM, num_kv_shared_layers=2, hidden_size_per_layer_input=32,
        vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0)),
    "phi": ("PhiForCausalLM", dict(partial_rotary_factor=0.5, layer_norm_eps=1e-5,
                                   num_key_value_heads=HEADS)),
    "phi3": ("Phi3ForCausalLM", dict(tie_word_embeddings=False)),
    "starcoder2": ("Starcoder2ForCausalLM", dict(norm_epsilon=1e-5, tie_word_embeddings=True)),
    "stablelm": ("StableLmForCausalLM", dict(use_qkv_bias=True, partial_rotary_factor=0.25,
                                             layer_norm_eps=1e-5, qk_layernorm=True)),
    "olmo2": ("Olmo2ForCausalLM", dict(tie_word_embeddings=False)),
    "olmo3": ("Olmo3ForCausalLM", dict(num_hidden_layers=4, sliding_window=WINDOW,
                                       tie_word_embeddings=False)),
    "granite": ("GraniteForCausalLM", dict(
        logits_scaling=4.0, attention_multiplier=0.05, embedding_multiplier=3.0,
        residual_multiplier=0.5, attention_bias=False, mlp_bias=False, tie_word_embeddings=True)),
    "cohere": ("CohereForCausalLM", dict(layer_norm_eps=1e-5, logit_scale=0.25, use_qk_norm=True)),
    "cohere2": ("Cohere2ForCausalLM", dict(num_hidden_layers=4, layer_norm_eps=1e-5,
                                           logit_scale=0.25, sliding_window=WINDOW,
                                           sliding_window_pattern=2)),
    "exaone4": ("Exaone4ForCausalLM", dict(num_hidden_layers=4, tie_word_embeddings=False,
                                           rope_scaling=None, sliding_window=WINDOW,
                                           sliding_window_pattern="LG")),
    "internlm2": ("InternLM2ForCausalLM", dict(bias=False, tie_word_embeddings=False)),
    "internlm3": ("InternLM3ForCausalLM", dict(qkv_bias=True, tie_word_embeddings=False)),
    "helium": ("HeliumForCausalLM", dict(attention_bias=False, mlp_bias=False,
                                         tie_word_embeddings=False)),
    "smollm3": ("SmolLM3ForCausalLM", dict(num_hidden_layers=4, no_rope_layer_interval=2,
                                           tie_word_embeddings=True)),
    "seed_oss": ("SeedOssForCausalLM", dict(attention_bias=True, tie_word_embeddings=False)),
    "glm4": ("Glm4ForCausalLM", dict(attention_bias=True, partial_rotary_factor=0.5)),
    "ernie4_5": ("Ernie4_5ForCausalLM", dict(use_bias=False, tie_word_embeddings=True)),
    "hunyuan_v1_dense": ("HunYuanDenseV1ForCausalLM", dict(use_qk_norm=True,
                                                           tie_word_embeddings=True)),
    "apertus": ("ApertusForCausalLM", dict(mlp_bias=False, attention_bias=False, post_norm=False,
                                           qk_norm=True, tie_word_embeddings=False)),
    "nemotron": ("NemotronForCausalLM", dict(hidden_act="relu2", norm_eps=1e-5,
                                             partial_rotary_factor=0.5)),
    "minicpm": ("MiniCPMForCausalLM", dict(dim_model_base=64, scale_depth=1.4, scale_emb=4.0,
                                           tie_word_embeddings=False)),
    "mimo": ("MiMoForCausalLM", dict(num_nextn_predict_layers=0, tie_word_embeddings=False)),
    "gpt_neox": ("GPTNeoXForCausalLM", dict(layer_norm_eps=1e-5, rotary_emb_base=10000,
                                            rotary_pct=0.25, use_parallel_residual=True)),
    "gpt2": ("GPT2LMHeadModel", dict(n_ctx=MAX_POS, n_embd=HIDDEN, n_head=HEADS, n_layer=2,
                                     n_positions=MAX_POS, layer_norm_epsilon=1e-5)),
    "gpt_bigcode": ("GPTBigCodeForCausalLM", dict(n_embd=HIDDEN, n_layer=2, n_inner=INTER,
                                                  n_head=HEADS, n_positions=MAX_POS,
                                                  layer_norm_epsilon=1e-5, multi_query=True)),
    # Mixture-of-experts: 4 experts, top-2 (llama4: top-1, as it ships), small
    # expert MLPs; shared experts, dense first layers, grouped and biased
    # routing where the family has them.
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(
        num_experts=MOE_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        shared_expert_intermediate_size=2 * MOE_INTER, tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(
        num_experts=MOE_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True,
        tie_word_embeddings=False)),
    "mixtral": ("MixtralForCausalLM", dict(
        num_local_experts=MOE_EXPERTS, num_experts_per_tok=2, intermediate_size=MOE_INTER,
        tie_word_embeddings=False)),
    "olmoe": ("OlmoeForCausalLM", dict(
        num_experts=MOE_EXPERTS, num_experts_per_tok=2, intermediate_size=MOE_INTER,
        norm_topk_prob=False, tie_word_embeddings=False)),
    "phimoe": ("PhimoeForCausalLM", dict(
        num_local_experts=MOE_EXPERTS, num_experts_per_tok=2, intermediate_size=MOE_INTER,
        original_max_position_embeddings=MAX_POS, tie_word_embeddings=False)),
    "granitemoe": ("GraniteMoeForCausalLM", dict(
        num_local_experts=MOE_EXPERTS, num_experts_per_tok=2, intermediate_size=MOE_INTER,
        logits_scaling=4.0, attention_multiplier=0.05, embedding_multiplier=3.0,
        residual_multiplier=0.5, attention_bias=False, tie_word_embeddings=True)),
    "ernie4_5_moe": ("Ernie4_5_MoeForCausalLM", dict(
        moe_num_experts=MOE_EXPERTS, moe_k=2, moe_intermediate_size=MOE_INTER,
        moe_num_shared_experts=1, moe_layer_start_index=1, use_bias=False,
        tie_word_embeddings=True)),
    "glm4_moe": ("Glm4MoeForCausalLM", dict(
        n_routed_experts=MOE_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, rope_scaling=None, use_qk_norm=True,
        attention_bias=True, partial_rotary_factor=0.5, tie_word_embeddings=False)),
    "llama4_text": ("Llama4ForCausalLM", dict(
        num_hidden_layers=4, num_local_experts=MOE_EXPERTS, num_experts_per_tok=1,
        interleave_moe_layer_step=2, intermediate_size=MOE_INTER, intermediate_size_mlp=INTER,
        attention_chunk_size=WINDOW, use_qk_norm=True, no_rope_layers=[1, 1, 1, 0],
        attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
        tie_word_embeddings=False)),
    "dbrx": ("DbrxForCausalLM", dict(
        d_model=HIDDEN, n_heads=HEADS, n_layers=2,
        ffn_config=dict(ffn_hidden_size=MOE_INTER, moe_num_experts=MOE_EXPERTS, moe_top_k=2),
        attn_config=dict(kv_n_heads=KV_HEADS, clip_qkv=8.0, rope_theta=10000.0),
        tie_word_embeddings=False)),
    "dots1": ("Dots1ForCausalLM", dict(
        n_routed_experts=MOE_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, scoring_func="noaux_tc", n_group=2, topk_group=1,
        tie_word_embeddings=False)),
    "bailing_moe": ("BailingMoeForCausalLM", dict(
        num_experts=MOE_EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        num_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=True,
        score_function="sigmoid", moe_router_enable_expert_bias=True, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, tie_word_embeddings=False)),
    "gpt_oss": ("GptOssForCausalLM", dict(
        num_hidden_layers=4, num_local_experts=MOE_EXPERTS, num_experts_per_tok=2,
        intermediate_size=MOE_INTER, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2, tie_word_embeddings=False)),
    "afmoe": ("AfmoeForCausalLM", dict(
        num_hidden_layers=4, num_experts=MOE_EXPERTS, num_experts_per_tok=2,
        moe_intermediate_size=MOE_INTER, num_shared_experts=1, num_dense_layers=1,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2,
        n_group=2, topk_group=1, route_scale=2.5, mup_enabled=True,
        tie_word_embeddings=False)),
    # Multi-head latent attention (a compressed KV row per token; queries absorbed
    # into the latent space), with DeepSeek-V3-style routed and shared experts.
    "deepseek_v3": ("DeepseekV3ForCausalLM", dict(
        kv_lora_rank=MLA_RANK, q_lora_rank=96, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=48, n_routed_experts=MOE_EXPERTS, num_experts_per_tok=2,
        moe_intermediate_size=MOE_INTER, n_shared_experts=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        topk_method="noaux_tc", scoring_func="sigmoid", tie_word_embeddings=False)),
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", dict(
        kv_lora_rank=MLA_RANK, q_lora_rank=None, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=48, n_routed_experts=MOE_EXPERTS, num_experts_per_tok=2,
        moe_intermediate_size=MOE_INTER, n_shared_experts=1, routed_scaling_factor=1.8,
        norm_topk_prob=True, first_k_dense_replace=1, num_nextn_predict_layers=0,
        tie_word_embeddings=False)),
    # Expanded MLA in mlx-lm (kv_b_proj whole): split per head at load, latent cache.
    "deepseek_v2": ("DeepseekV2ForCausalLM", dict(
        kv_lora_rank=MLA_RANK, q_lora_rank=96, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=48, n_routed_experts=MOE_EXPERTS, num_experts_per_tok=2,
        moe_intermediate_size=MOE_INTER, n_shared_experts=1, first_k_dense_replace=1,
        topk_method="greedy", tie_word_embeddings=False,
        rope_scaling=dict(type="yarn", factor=1.0, original_max_position_embeddings=MAX_POS,
                          beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.0))),
    "minicpm3": ("MiniCPM3ForCausalLM", dict(
        kv_lora_rank=MLA_RANK, q_lora_rank=96, qk_rope_head_dim=32, qk_nope_head_dim=32,
        dim_model_base=64, scale_depth=1.4, scale_emb=12.0, num_key_value_heads=HEADS,
        tie_word_embeddings=False,
        rope_scaling=dict(type="longrope", long_factor=[1.0] * 16, short_factor=[1.0] * 16,
                          original_max_position_embeddings=MAX_POS))),
    # Hybrids: Gated DeltaNet (linear attention, a recurrent state per request)
    # layers between full-attention ones; 4 layers, every second one attention.
    "qwen3_next": ("Qwen3NextForCausalLM", dict(
        num_hidden_layers=4, full_attention_interval=2, **_GDN, num_experts=MOE_EXPERTS,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        moe_intermediate_size=MOE_INTER, shared_expert_intermediate_size=MOE_INTER,
        norm_topk_prob=True, partial_rotary_factor=0.25, tie_word_embeddings=False)),
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", dict(text_config=dict(
        model_type="qwen3_5_text", **{k: v for k, v in _DIMS.items() if k != "num_hidden_layers"},
        num_hidden_layers=4, full_attention_interval=2, **_GDN, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                             mrope_section=[4, 2, 2], mrope_interleaved=True)),
        tie_word_embeddings=False)),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", dict(text_config=dict(
        model_type="qwen3_5_moe_text",
        **{k: v for k, v in _DIMS.items() if k != "num_hidden_layers"},
        num_hidden_layers=4, full_attention_interval=2, **_GDN, num_experts=MOE_EXPERTS,
        num_experts_per_tok=2, moe_intermediate_size=MOE_INTER,
        shared_expert_intermediate_size=MOE_INTER, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                             mrope_section=[4, 2, 2], mrope_interleaved=True)),
        tie_word_embeddings=False)),
    # One conv each for q, k and v; beta in [0, 2].
    "olmo_hybrid": ("OlmoHybridForCausalLM", dict(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, **_GDN,
        linear_allow_neg_eigval=True, attention_bias=False, layer_norm_epsilon=1e-6,
        tie_word_embeddings=False)),
    # Short-convolution layers (a conv state per request) between attention ones.
    "lfm2": ("Lfm2ForCausalLM", dict(
        num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2, norm_eps=1e-5,
        conv_bias=False, conv_L_cache=3, block_dim=HIDDEN, block_ff_dim=INTER,
        block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        tie_word_embeddings=True)),
    # Mamba2 (SSD) mixers between attention layers: 4 heads of 32 over 2 groups of
    # B/C, a 16-wide state; nemotron_h adds a ReLU² MLP layer of its own.
    "nemotron_h": ("NemotronHForCausalLM", dict(
        num_hidden_layers=4, layers_block_type=["mamba", "attention", "mamba", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=32, ssm_state_size=16, n_groups=2, conv_kernel=4, use_conv_bias=True,
        mamba_proj_bias=False, attention_bias=False, mlp_bias=False, use_bias=False,
        layer_norm_epsilon=1e-5, tie_word_embeddings=False)),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM", dict(
        num_hidden_layers=4, layer_types=["mamba", "attention"] * 2, mamba_n_heads=8,
        mamba_d_head=32, mamba_expand=1, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
        mamba_conv_bias=True, mamba_proj_bias=False, num_local_experts=MOE_EXPERTS,
        num_experts_per_tok=2, intermediate_size=MOE_INTER, shared_intermediate_size=INTER,
        embedding_multiplier=2.0, attention_multiplier=0.125, logits_scaling=4.0,
        residual_multiplier=0.5, position_embedding_type="rope", attention_bias=False,
        tie_word_embeddings=False)),
    # Every layer runs a Mamba2 mixer and attention side by side (mlx-lm's CacheList),
    # with the checkpoint's muP multipliers at their defaults.
    "falcon_h1": ("FalconH1ForCausalLM", dict(
        mamba_n_heads=8, mamba_d_head=32, mamba_d_ssm=256, mamba_expand=1, mamba_d_state=16,
        mamba_n_groups=2, mamba_d_conv=4, mamba_rms_norm=True, mamba_norm_before_gate=False,
        mamba_chunk_size=16, tie_word_embeddings=False)),
    # Mamba2 layers only (no attention), tied embeddings as the mamba2 checkpoints ship.
    "mamba2": ("Mamba2ForCausalLM", dict(
        num_heads=8, head_dim=32, expand=1, state_size=16, n_groups=2, conv_kernel=4,
        use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5, time_step_rank="auto",
        time_step_limit=(0.0, float("inf")), residual_in_fp32=True,
        tie_word_embeddings=True)),
}

# Hybrids: Gated DeltaNet, Mamba2 or short-conv layers keep a state per request.
HYBRIDS = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "lfm2", "nemotron_h",
           "granitemoehybrid", "falcon_h1", "mamba2"}

# Model types transformers 5 has no configuration class for (their hub
# checkpoints ship one as remote code).
REMOTE_CODE = {"internlm2", "internlm3", "minicpm", "mimo", "bailing_moe"}

_GAIN = {"o_proj": 3.0, "down_proj": 3.0, "dense": 3.0, "c_proj": 3.0, "wo": 3.0, "w2": 3.0,
         "out_proj": 3.0, "dense_4h_to_h": 3.0, "fc2": 3.0}
_DEFAULT_GAIN = 1.5
_SPECIAL_ROW_SCALE = 0.05


def make_family_model(path: str | Path, family: str, *, seed: int = 0,
                      quantize_bits: int | None = None, group_size: int = 64,
                      quantize_mode: str = "affine", **overrides: Any) -> Path:
    """Write a checkpoint of mlx-lm ``model_type`` ``family`` at ``path``; returns it.

    ``quantize_bits`` 4 or 8: MLX affine quantization (mlx-lm's own), as
    mlx-community's 4bit/8bit checkpoints are made. ``quantize_mode`` "mxfp4"
    (with quantize_bits 8): the experts in MXFP4 and every other linear in 8-bit
    affine, as mlx-community's gpt-oss MXFP4-Q8 checkpoints are made.
    """
    import contextlib
    import io

    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model, save_model

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"path {str(path)!r} exists and is not empty")
    tokenizer = _train_tokenizer(VOCAB)
    config = _config(family, tokenizer, overrides)
    model = _instantiate(config)
    rng = np.random.default_rng(seed)
    damped = _damped_ids(tokenizer)
    params = {name: mx.array(_init(name, np.array(p), rng, damped))
              for name, p in tree_flatten(model.parameters())}
    model.update(tree_unflatten(list(params.items())))
    if quantize_bits is not None:
        predicate = None
        if quantize_mode == "mxfp4":
            from mlx_lm.models.switch_layers import SwitchLinear

            def predicate(_path, module):
                if isinstance(module, SwitchLinear):
                    return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
                return True
        elif quantize_mode != "affine":
            raise ValueError(f"quantize_mode must be 'affine' or 'mxfp4', got {quantize_mode!r}")
        with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints bits per weight
            model, config = quantize_model(model, config, group_size, quantize_bits,
                                           quant_predicate=predicate)
    path.mkdir(parents=True, exist_ok=True)
    save_model(path, model)
    _write_json(path / "config.json", config)
    if family in REMOTE_CODE:
        _write_remote_config(path, family)
    _write_tokenizer(path, tokenizer, config)
    return path


def cached_family_model(family: str, **overrides: Any) -> Path:
    """Build once per process (keyed by arguments) into a temp dir removed at exit."""
    return cached_build(make_family_model, family, overrides)


def _config(family: str, tokenizer, overrides: dict) -> dict:
    arch, extra = FAMILIES[family]
    config = {"architectures": [arch], "model_type": family, **_DIMS, **extra, **overrides,
              "torch_dtype": "float32", "bos_token_id": tokenizer.token_to_id(BOS),
              "eos_token_id": tokenizer.token_to_id(EOS),
              "pad_token_id": tokenizer.token_to_id(PAD)}
    if family == "gemma3_text":
        config["layer_types"] = [
            "full_attention" if (i + 1) % config["sliding_window_pattern"] == 0
            else "sliding_attention" for i in range(config["num_hidden_layers"])]
    if family == "exaone4":   # as EXAONE 4 checkpoints ship it: pattern and the list
        pattern = config["sliding_window_pattern"]
        config["layer_types"] = [
            "full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention"
            for i in range(config["num_hidden_layers"])]
    if family == "olmo3":
        config["layer_types"] = [
            "full_attention" if (i + 1) % 2 == 0 else "sliding_attention"
            for i in range(config["num_hidden_layers"])]
    return config


def _instantiate(config: dict):
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


def _init(name: str, p: np.ndarray, rng: np.random.Generator, damped: list[int]) -> np.ndarray:
    if not np.issubdtype(p.dtype, np.floating):
        return p
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") else ""
    if leaf == "bias":
        return rng.normal(0.0, 0.1, p.shape).astype(np.float32)
    if p.ndim == 1:   # norms and other per-channel scales: near their init
        return (p + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
    if p.ndim != 2:
        return p.astype(np.float32)
    if p.shape[0] == VOCAB:   # embedding rows or an output head [vocab, hidden]
        rows = rng.normal(0.0, 1.0, p.shape).astype(np.float32)
        rows[damped] *= _SPECIAL_ROW_SCALE
        return rows
    gain = _GAIN.get(owner, _DEFAULT_GAIN)
    return rng.normal(0.0, gain / np.sqrt(p.shape[1]), p.shape).astype(np.float32)


def _write_remote_config(path: Path, family: str) -> None:
    (path / "configuration_tiny.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class TinyConfig(PretrainedConfig):\n"
        f"    model_type = {family!r}\n")
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_tiny.TinyConfig"}
    _write_json(path / "config.json", config)


def _write_tokenizer(path: Path, tokenizer, config: dict) -> None:
    from tests.tiny_models import CHAT_TEMPLATE

    tokenizer.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "pad_token": PAD, "model_max_length": MAX_POS, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE})
    _write_json(path / "generation_config.json", {
        k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")})


