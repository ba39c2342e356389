"""GGUF files of each supported architecture, converted as llama.cpp converts them, load
as mlx-lm's model of the family: float files reproduce the source checkpoint, quantized
ones the `gguf` package's dequantized values; what cannot be served is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from tests.gguf.reference import assert_close_logits, mlx_lm_with_gguf_values
from tests.gguf_models import (
    FAMILY_ARCHS, LATENT_FAMILIES, MXFP4_EXPERTS, family_source, make_family_gguf, recipe_types,
)
from vllm_metal.gguf.config import hf_config_from_gguf
from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.loader import load_gguf_model

FAMILIES = tuple(FAMILY_ARCHS)
PROMPT = [1, 5, 17, 33, 90, 200, 301, 7, 64, 128, 255, 399, 500, 700, 900, 1000, 3, 4, 8, 9]
# llama.cpp's Q4_K_M recipe in miniature: Q4_K weights, Q6_K for attn_v, ffn_down and the
# head, the embedding in Q4_K.
Q4_K_M = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}


@pytest.fixture(scope="module")
def family_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-gguf")
    built: dict = {}

    def build(family: str, qtype: str = "F32", **overrides) -> Path:
        key = (family, qtype, json.dumps(overrides, sort_keys=True))
        if key not in built:
            directory = root / f"{family}-{qtype}-{len(built)}"
            directory.mkdir()
            types = None
            if qtype == "Q4_K_M":
                types = recipe_types(family, Q4_K_M, **overrides)
                qtype = "Q4_K"
            built[key] = make_family_gguf(directory / "model.gguf", family, qtype,
                                          tensor_types=types, **overrides)
        return built[key]

    return build


def logits(model) -> np.ndarray:
    return np.array(model(mx.array([PROMPT]))[0].astype(mx.float32))


@pytest.mark.parametrize("family", FAMILIES)
def test_float_file_reproduces_the_source_checkpoint(family_gguf, family):
    from mlx_lm.utils import load_model

    source, _ = load_model(family_source(family))
    model, _ = load_gguf_model(family_gguf(family))
    assert_close_logits(logits(model), logits(source), rtol=1e-5)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q4_K_M"])
@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_file_matches_its_dequantized_values(family_gguf, family, qtype):
    path = family_gguf(family, qtype)
    model, _ = load_gguf_model(path)
    assert_close_logits(logits(model), logits(mlx_lm_with_gguf_values(path, family)), rtol=2e-5)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q6_K"])
def test_every_block_type_loads(family_gguf, qtype):
    path = family_gguf("qwen3", qtype)
    model, _ = load_gguf_model(path)
    assert_close_logits(logits(model), logits(mlx_lm_with_gguf_values(path, "qwen3")), rtol=2e-5)


@pytest.mark.parametrize("family,qtype,bits", [("llama", "Q4_K", 4), ("gemma3_text", "Q5_K", 8),
                                               ("phi3", "Q6_K", 8), ("granite", "Q8_0", 8)])
def test_quantized_layers_stay_quantized(family_gguf, family, qtype, bits):
    import mlx.nn as nn

    model, _ = load_gguf_model(family_gguf(family, qtype))
    layers = [m for _, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert layers and all(m.bits == bits and m.group_size == 32 for m in layers)


FAMILY_KEYS = {
    "gemma2": ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"),
    "gemma3_text": ("query_pre_attn_scalar", "sliding_window", "sliding_window_pattern",
                    "rope_local_base_freq", "rope_theta"),
    "granite": ("logits_scaling", "attention_multiplier", "embedding_multiplier",
                "residual_multiplier"),
    "starcoder2": ("norm_epsilon",),
    "smollm3": ("no_rope_layer_interval",),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "norm_topk_prob", "mlp_only_layers"),
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "olmoe": ("num_experts", "num_experts_per_tok", "intermediate_size", "norm_topk_prob"),
    "deepseek_v3": ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                    "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                    "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                    "scoring_func", "topk_method"),
    "deepseek_v2": ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                    "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                    "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size",
                "sliding_window", "layer_types"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_config_carries_the_family_values(family_gguf, family):
    source = json.loads((family_source(family) / "config.json").read_text())
    config = hf_config_from_gguf(read_header(family_gguf(family)))
    # An MLA file stores one latent "kv head"; its config states HF's (= query heads).
    kv_heads = () if family in LATENT_FAMILIES else ("num_key_value_heads",)
    for key in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                "num_attention_heads", *kv_heads, "vocab_size",
                "tie_word_embeddings", *FAMILY_KEYS.get(family, ())):
        if key in source:  # mlx-lm's gemma3_text writes no tie flag
            assert config[key] == pytest.approx(source[key]), key


@pytest.mark.parametrize("family", FAMILIES)
def test_written_config_loads_in_transformers(family_gguf, family, tmp_path):
    """vLLM reads config.json through transformers' strict config classes."""
    from transformers import AutoConfig

    from vllm_metal.gguf.loader import materialize_hf_dir

    hf_dir = materialize_hf_dir(family_gguf(family), cache_root=tmp_path)
    config = AutoConfig.from_pretrained(hf_dir)
    assert config.model_type == hf_config_from_gguf(read_header(family_gguf(family)))[
        "model_type"]


def test_phi3_partial_rotary_and_longrope(family_gguf):
    from mlx_lm.utils import load_model

    scaling = {"type": "longrope", "long_factor": [1.0 + i / 8 for i in range(16)],
               "short_factor": [1.0 + i / 32 for i in range(16)]}
    overrides = dict(partial_rotary_factor=0.5, rope_scaling=scaling,
                     original_max_position_embeddings=1024)
    path = family_gguf("phi3", **overrides)
    config = hf_config_from_gguf(read_header(path))
    assert config["partial_rotary_factor"] == 0.5
    assert config["rope_scaling"]["long_factor"] == pytest.approx(scaling["long_factor"])
    assert config["original_max_position_embeddings"] == 1024
    source, _ = load_model(family_source("phi3", **overrides))
    model, _ = load_gguf_model(path)
    assert_close_logits(logits(model), logits(source), rtol=1e-5)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "phi3", "starcoder2"])
def test_transformers_reads_the_test_files_as_the_source(family_gguf, family):
    """transformers' own GGUF reader (names, converter transforms, dequantization) recovers
    the source weights from the float files: the test converter writes what llama.cpp's
    does."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    path = family_gguf(family)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    source = {}
    for file in family_source(family).glob("*.safetensors"):
        source.update(load_file(str(file)))
    for name, array in source.items():
        np.testing.assert_allclose(state[name], array, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("family", ["phi3", "starcoder2", "qwen2"])
def test_k_quant_logits_match_transformers(family_gguf, family):
    """transformers dequantizes K-quants with its own code; our exact mapping agrees."""
    from tests.gguf.reference import transformers_gguf_model, transformers_logits

    path = family_gguf(family, "Q4_K")
    model, _ = load_gguf_model(path)
    ref = transformers_logits(transformers_gguf_model(path), PROMPT)
    # transformers' starcoder2 GELU is not MLX's tanh approximation bit for bit (the float
    # file differs by 2e-4 too); a wrong block decode would differ by far more.
    assert_close_logits(logits(model), ref, rtol=1e-3 if family == "starcoder2" else 2e-5)


def test_mxfp4_experts_stay_mxfp4(tmp_path):
    """gpt-oss as llama.cpp converts OpenAI's checkpoint: MXFP4 experts become MLX mxfp4
    layers holding the same codes and exponents (the `gguf` package's dequantizer is the
    reference), the rest Q8_0."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    path = make_family_gguf(tmp_path / "m.gguf", "gpt_oss", "Q8_0",
                            tensor_types=recipe_types("gpt_oss", MXFP4_EXPERTS))
    model, _ = load_gguf_model(path)
    experts = [m for _, m in model.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    assert len(experts) == 3 * 4 and all(m.mode == "mxfp4" for m in experts)
    ref = mlx_lm_with_gguf_values(path, "gpt_oss")
    assert_close_logits(logits(model), logits(ref), rtol=2e-5)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
def test_moe_logits_match_transformers(family_gguf, family, qtype):
    """transformers' GGUF reader stacks nothing: it splits the expert tensors back into
    per-expert HF matrices and runs its own MoE; its logits are an independent check of
    the expert layout, the routing keys and the shared expert."""
    from tests.gguf.reference import transformers_gguf_model, transformers_logits

    path = family_gguf(family, qtype)
    model, _ = load_gguf_model(path)
    ref = transformers_logits(transformers_gguf_model(path), PROMPT)
    assert_close_logits(logits(model), ref, rtol=2e-5)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "IQ4_XS", "IQ2_XXS", "TQ1_0"])
def test_other_types_are_refused_by_name(tmp_path, qtype):
    path = make_family_gguf(tmp_path / "m.gguf", "olmo2", "Q8_0",
                            tensor_types={"blk.1.ffn_up.weight": qtype})
    with pytest.raises(ValueError, match=rf"'blk\.1\.ffn_up\.weight' has type {qtype}"):
        load_gguf_model(path)


def test_a_tensor_the_model_has_no_place_for_is_refused(tmp_path, family_gguf):
    extra = {"blk.0.ffn_gate_exps.weight": np.zeros((2, 32, 32), np.float32)}
    path = _rewritten(family_gguf("olmo2"), tmp_path / "extra.gguf", tensors=extra)
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_exps\.weight' has no place"):
        load_gguf_model(path)


def test_a_missing_parameter_is_refused_by_name(family_gguf):
    import dataclasses

    from vllm_metal.gguf import weights

    path = family_gguf("granite")
    header = read_header(path)
    tensors = {k: v for k, v in header.tensors.items() if k != "blk.1.ffn_gate.weight"}
    header = dataclasses.replace(header, tensors=tensors)
    config = hf_config_from_gguf(header)
    from mlx_lm.utils import _get_classes

    from vllm_metal.gguf.architectures import ARCHITECTURES

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.gate_proj\.weight'"):
        list(weights.gguf_weights(header, model, ARCHITECTURES["granite"], config))


def test_gemma3_final_softcap_is_refused(family_gguf):
    import dataclasses

    header = read_header(family_gguf("gemma3_text"))
    header = dataclasses.replace(
        header, metadata={**header.metadata, "gemma3.final_logit_softcapping": 30.0})
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        hf_config_from_gguf(header)


@pytest.mark.parametrize("flags,pattern", [([True] * 5 + [False], 6),
                                           ([True, False] * 3, 2), ([False] * 6, 1)])
def test_gemma3_per_layer_window_flags(family_gguf, flags, pattern):
    import dataclasses

    header = read_header(family_gguf("gemma3_text"))
    header = dataclasses.replace(header, metadata={
        **header.metadata, "gemma3.attention.sliding_window_pattern": flags,
        "gemma3.rope.freq_base_swa": 5000.0})
    config = hf_config_from_gguf(header)
    assert config["sliding_window_pattern"] == pattern
    assert config["rope_local_base_freq"] == 5000.0
    assert config["layer_types"] == ["sliding_attention" if f else "full_attention"
                                     for f in flags]


def test_gemma3_irregular_window_flags_are_refused(family_gguf):
    import dataclasses

    header = read_header(family_gguf("gemma3_text"))
    header = dataclasses.replace(header, metadata={
        **header.metadata,
        "gemma3.attention.sliding_window_pattern": [True, False, False, True, True, False]})
    with pytest.raises(ValueError, match="do not repeat with one period"):
        hf_config_from_gguf(header)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_deepseek_yarn_mscale_matches_the_source(family_gguf, family):
    """The converter stores 0.1 * mscale_all_dim as yarn_log_multiplier; the loaded model
    must scale RoPE and the softmax as the source config does (prompt past the original
    context, so the interpolated frequencies matter)."""
    from mlx_lm.utils import load_model

    scaling = dict(type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32,
                   beta_slow=1, mscale=0.707, mscale_all_dim=0.707)
    overrides = dict(rope_scaling=scaling, max_position_embeddings=64)
    model, config = load_gguf_model(family_gguf(family, **overrides))
    assert config["rope_scaling"]["mscale_all_dim"] == pytest.approx(0.707)
    source, _ = load_model(family_source(family, **overrides))
    plain, _ = load_model(family_source(family))
    ids = mx.array([PROMPT * 2])
    ours, ref = (np.array(m(ids)[0]) for m in (model, source))
    assert_close_logits(ours, ref, rtol=1e-5)
    assert np.abs(np.array(plain(ids)[0]) - ref).max() > 1e-2 * np.abs(ref).max()


def _rewritten(source: Path, path: Path, drop=(), tensors=None, **metadata) -> Path:
    """A copy of the GGUF at `source` with metadata keys dropped or set (int/float/bool)
    and float32 `tensors` (name -> array) added."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(path), arch)
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")) or field.name in drop \
                or field.name in metadata:
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if len(field.types) > 1 else None)
    for key, value in metadata.items():
        kind = (gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.UINT32
                if isinstance(value, int) else gguf.GGUFValueType.FLOAT32)
        writer.add_key_value(key, value, kind)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family,change,message", [
    ("qwen3_moe", dict(**{"qwen3moe.expert_weights_scale": 2.5}), "expert_weights_scale 2.5"),
    ("gpt_oss", dict(**{"gpt-oss.rope.freq_base_swa": 1234.0}), "freq_base_swa"),
    ("deepseek_v2", dict(**{"deepseek2.expert_group_count": 2}), "routes differently"),
    ("deepseek_v2", dict(**{"deepseek2.expert_weights_norm": True}), "routes differently"),
    ("deepseek_v3", dict(**{"deepseek2.expert_gating_func": 3}), "neither softmax nor sigmoid"),
    ("deepseek_v3", dict(drop=("deepseek2.attention.key_length_mla",)), "re-convert"),
])
def test_moe_files_mlx_lm_would_run_differently_are_refused(family_gguf, tmp_path, family,
                                                             change, message):
    path = _rewritten(family_gguf(family), tmp_path / "changed.gguf", **change)
    with pytest.raises(ValueError, match=message):
        hf_config_from_gguf(read_header(path))
