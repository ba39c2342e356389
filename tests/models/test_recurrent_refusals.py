"""Every mlx-lm family that keeps a recurrent state other than Gated DeltaNet, Mamba2
or short convolutions is refused at load, by name: ``UnsupportedModelError`` naming
the model_type. Layers of short convolutions only (LFM2's, Gear's conv mixer) and
Mamba2 mixers, beside attention layers (Nemotron-H, Granite 4 hybrids, Falcon-H1) or
alone (Mamba2), are served: the paged forward equals mlx-lm's own.

Each family is built by mlx-lm's own classes from the smallest config it accepts
(hidden 64, 2-4 layers mixing its recurrent and attention layer kinds, vocab 256),
whose own dense forward runs, so a refusal is of the family and not of a broken config.
"""

import mlx.core as mx
import pytest

from vllm_metal.models.adapter import ModelAdapter, UnsupportedModelError

_D = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
          rms_norm_eps=1e-6, rope_theta=10000.0)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_MLA = dict(kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
            v_head_dim=16)
_BAILING = dict(_D, **_MOE, num_hidden_layers=4, layer_group_size=2, group_norm_size=1,
                num_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                head_dim=16, num_key_value_heads=4)

# family -> its config (model_type added by the test).
FAMILIES: dict[str, dict] = {
    "mamba": dict(_D, state_size=8, conv_kernel=4, use_bias=False, use_conv_bias=True,
                  time_step_rank=4),
    "mamba2": dict(_D, num_heads=4, head_dim=32, state_size=8, layer_norm_epsilon=1e-5,
                   conv_kernel=4, n_groups=1, use_bias=False, use_conv_bias=True,
                   tie_word_embeddings=True, time_step_limit=(0.0, float("inf")),
                   time_step_rank="auto"),
    "jamba": dict(_D, **_MOE, num_hidden_layers=4, attn_layer_offset=1, attn_layer_period=2,
                  expert_layer_offset=1, expert_layer_period=2, mamba_d_conv=4,
                  mamba_d_state=8, mamba_expand=2),
    "falcon_h1": dict(_D, head_dim=16, mamba_d_head=16, mamba_n_heads=8, mamba_d_ssm=128,
                      mamba_d_state=8, mamba_chunk_size=16),
    "nemotron_h": dict(_D, hybrid_override_pattern=["M", "*", "M", "-"], attention_bias=False,
                       mamba_num_heads=4, mamba_head_dim=16, mamba_proj_bias=False,
                       ssm_state_size=8, conv_kernel=4, n_groups=1, mlp_bias=False,
                       layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True,
                       head_dim=16),
    "granitemoehybrid": dict(_D, layer_types=["mamba", "attention"], attention_bias=False,
                             embedding_multiplier=1.0, attention_multiplier=0.25,
                             logits_scaling=1.0, residual_multiplier=1.0, mamba_n_heads=4,
                             mamba_d_head=32, mamba_proj_bias=False, mamba_d_state=8,
                             mamba_d_conv=4, mamba_n_groups=1, mamba_conv_bias=True,
                             shared_intermediate_size=128),
    "lfm2": dict(_D, layer_types=["conv", "full_attention"], norm_eps=1e-5, conv_bias=False,
                 conv_L_cache=3, block_dim=64, block_multiple_of=16,
                 block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
                 block_ff_dim=128),
    "lfm2_moe": dict(_D, **_MOE, num_hidden_layers=3,
                     layer_types=["conv", "full_attention", "conv"], norm_topk_prob=True,
                     use_expert_bias=True, num_dense_layers=1, norm_eps=1e-5, conv_bias=False,
                     conv_L_cache=3),
    "recurrent_gemma": dict(_D, num_hidden_layers=3, block_types=["recurrent", "attention"],
                            num_key_value_heads=1, attention_bias=False, conv1d_width=4,
                            logits_soft_cap=30.0, attention_window_size=16),
    "rwkv7": dict(_D, norm_eps=1e-5, head_dim=32, a_low_rank_dim=16, v_low_rank_dim=16,
                  gate_low_rank_dim=16, decay_low_rank_dim=16),
    "plamo2": dict(_D, hidden_size_per_head=16, attention_window_size=16, mamba_d_state=8,
                   mamba_d_conv=4, mamba_num_heads=4, mamba_step=2, mamba_chunk_size=16),
    "baichuan_m1": dict(_D, sliding_window=16, sliding_window_layers=[0], conv_window=2),
    "bailing_hybrid": dict(_BAILING, **_MLA | dict(q_lora_rank=None), routed_scaling_factor=1.0),
    "bailing_moe_linear": dict(_BAILING, norm_topk_prob=True),
    "longcat_flash_ngram": dict(_D, **_MLA, ffn_hidden_size=128, moe_topk=2,
                                expert_ffn_hidden_size=32, n_routed_experts=4,
                                zero_expert_num=1, num_layers=2, routed_scaling_factor=1.0,
                                mla_scale_q_lora=True, mla_scale_kv_lora=True,
                                ngram_vocab_size_ratio=2),
    "gear": dict(_D, head_dim=16, layer_types=["conv_mixer", "full_attention"],
                 sliding_window=16),
    "kimi_k3": dict(text_config=dict(
        _D, **_MOE, **_MLA, num_key_value_heads=4, first_k_dense_replace=1,
        num_experts_per_token=2,
        linear_attn_config=dict(kda_layers=[1], num_heads=4, head_dim=16,
                                short_conv_kernel_size=4))),
}

# family -> why the adapter does not refuse it by name (recorded, not hidden).
_MISBEHAVES: dict[str, str] = {}


def _instantiate(config: dict):
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


# Short convolutions only, or Mamba2 mixers (with or without attention): paged.
SERVED = {"lfm2", "lfm2_moe", "gear", "nemotron_h", "granitemoehybrid", "falcon_h1", "mamba2"}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=_MISBEHAVES[f]))
    if f in _MISBEHAVES else f for f in FAMILIES if f not in SERVED])
def test_recurrent_family_refused_by_name(family):
    model = _instantiate(dict(FAMILIES[family], model_type=family))
    mx.eval(model(mx.zeros((1, 3), dtype=mx.int32), cache=model.make_cache()))
    with pytest.raises(UnsupportedModelError, match=family):
        ModelAdapter(model)


@pytest.mark.parametrize("family", sorted(SERVED))
def test_state_family_served_exactly(family):
    from tests.models.test_family_sweep import _TOKENS, paged_logits

    model = _instantiate(dict(FAMILIES[family], model_type=family))
    want = model(mx.array([_TOKENS]), cache=model.make_cache())[0]
    got = paged_logits(ModelAdapter(model), _TOKENS)
    scale = max(float(mx.abs(want).max()), 1.0)
    assert float(mx.abs(got - want).max()) <= 1e-4 * scale
