"""Tiny GGUF files written the way llama.cpp's converter writes them, for tests.

`make_tiny_gguf(path, family, qtype)` converts a tiny random-weight HF checkpoint from
`tests.tiny_models` (same weights, tokenizer and config) into a GGUF with the `gguf`
package: llama.cpp tensor names, Q/K rows permuted for llama, 2-D weights stored as
`qtype` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, ...), 1-D tensors as F32. The source HF
directory stays available as an independent reference (`hf_dir_for`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tests import gguf_kquants
from tests.tiny_models import CHAT_TEMPLATE, cached_tiny_model

TINY_DIMS = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=64, intermediate_size=256, vocab_size=400)
# transformers reads no head_dim from a qwen3 GGUF and falls back to Qwen3Config's 128;
# 128 also gives a model whose heads * head_dim (256) differs from hidden_size.
_FAMILY_DIMS = {"qwen3": dict(head_dim=128)}

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def hf_dir_for(family: str, rope_scaling: str | None = None) -> Path:
    """The tiny HF checkpoint a tiny GGUF of `family` is converted from."""
    return cached_tiny_model(family, rope_scaling=rope_scaling,
                             **{**TINY_DIMS, **_FAMILY_DIMS.get(family, {})})


def make_tiny_gguf(
    path: str | Path,
    family: str = "llama",
    qtype: str = "F32",
    *,
    rope_scaling: str | None = None,
    architecture: str | None = None,
    tensor_types: dict[str, str] | None = None,
    pre: str = "gpt2",
) -> Path:
    """Write a tiny GGUF at `path`; returns `path`.

    `rope_scaling`: None, "linear", "yarn" (metadata keys) or "llama3" (rope_freqs
    tensor). `architecture` overrides general.architecture; `tensor_types` overrides
    the type of single GGUF tensors by name.
    """
    import gguf
    from safetensors.numpy import load_file

    src = hf_dir_for(family, rope_scaling)
    config = json.loads((src / "config.json").read_text())
    weights = load_file(str(src / "model.safetensors"))
    arch = architecture or family
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, config)
    _write_tokenizer(writer, src, config, pre)
    if config.get("rope_scaling"):
        _write_rope_scaling(writer, config)

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for hf_name, array in weights.items():
        name = gguf_name(hf_name)
        if family == "llama" and ".attn_q." in name:
            array = llama_cpp_permute(array, heads)
        elif family == "llama" and ".attn_k." in name:
            array = llama_cpp_permute(array, kv_heads)
        kind = (tensor_types or {}).get(name, qtype if array.ndim == 2 else "F32")
        _add_tensor(writer, name, array, kind)
    if config.get("rope_scaling", {}) and config["rope_scaling"]["rope_type"] == "llama3":
        freqs = llama3_rope_freqs(config)
        _add_tensor(writer, "rope_freqs.weight", freqs, "F32")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def gguf_name(hf_name: str) -> str:
    module, suffix = hf_name.rsplit(".", 1)
    if module in _TOP_NAMES:
        return f"{_TOP_NAMES[module]}.{suffix}"
    _, _, layer, rest = module.split(".", 3)  # model.layers.N.rest
    return f"blk.{layer}.{_LAYER_NAMES[rest]}.{suffix}"


def llama_cpp_permute(array: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: within each head, row j*d/2 + i moves to 2*i + j."""
    head_dim = array.shape[0] // n_heads
    out = np.empty_like(array)
    for h in range(n_heads):
        for j in range(2):
            for i in range(head_dim // 2):
                out[h * head_dim + 2 * i + j] = array[h * head_dim + j * head_dim // 2 + i]
    return out


def llama3_rope_freqs(config: dict[str, Any]) -> np.ndarray:
    """float32 [head_dim / 2]: the rope_freqs tensor llama.cpp writes for llama3 scaling."""
    scaling, dims = config["rope_scaling"], config["head_dim"]
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * math.pi * config["rope_theta"] ** (i / dims)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _write_hparams(writer, config: dict[str, Any]) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_vocab_size(config["vocab_size"])


def _write_rope_scaling(writer, config: dict[str, Any]) -> None:
    import gguf

    scaling = config["rope_scaling"]
    if scaling["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    elif scaling["rope_type"] == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])


def _write_tokenizer(writer, src: Path, config: dict[str, Any], pre: str) -> None:
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m
                             for m in tok["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)


def _add_tensor(writer, name: str, array: np.ndarray, kind: str) -> None:
    import gguf

    array = np.ascontiguousarray(array, dtype=np.float32)
    if kind == "F32":
        writer.add_tensor(name, array)
    elif kind == "F16":
        writer.add_tensor(name, array.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[kind]
        if kind in ("Q4_K", "Q5_K", "Q6_K"):
            rows = gguf_kquants.quantize(array.reshape(-1, array.shape[-1]), kind)
            data = rows.reshape(*array.shape[:-1], -1)
        else:
            try:
                data = gguf.quants.quantize(array, qtype)
            except NotImplementedError:
                # gguf-py cannot quantize these; random blocks of the right size are
                # enough where only the tensor's type is under test.
                block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
                shape = (*array.shape[:-1], array.shape[-1] // block * nbytes)
                data = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
        writer.add_tensor(name, data, raw_dtype=qtype)


# mlx-lm family -> (general.architecture, gguf.MODEL_ARCH name, converter permutes Q/K,
# converter adds 1 to norm weights). Facts of llama.cpp's convert_hf_to_gguf.
FAMILY_ARCHS = {
    "llama": ("llama", "LLAMA", True, False),
    "qwen2": ("qwen2", "QWEN2", False, False),
    "qwen3": ("qwen3", "QWEN3", False, False),
    "gemma": ("gemma", "GEMMA", False, True),
    "gemma2": ("gemma2", "GEMMA2", False, True),
    "gemma3_text": ("gemma3", "GEMMA3", False, True),
    "phi3": ("phi3", "PHI3", False, False),
    "olmo2": ("olmo2", "OLMO2", False, False),
    "granite": ("granite", "GRANITE", True, False),
    "starcoder2": ("starcoder2", "STARCODER2", False, False),
    "smollm3": ("smollm3", "SMOLLM3", True, False),
    "qwen2_moe": ("qwen2moe", "QWEN2MOE", False, False),
    "qwen3_moe": ("qwen3moe", "QWEN3MOE", False, False),
    "mixtral": ("llama", "LLAMA", True, False),
    "olmoe": ("olmoe", "OLMOE", False, False),
    "gpt_oss": ("gpt-oss", "GPT_OSS", False, False),
    "deepseek_v3": ("deepseek2", "DEEPSEEK2", False, False),
    "deepseek_v2": ("deepseek2", "DEEPSEEK2", False, False),
}
LATENT_FAMILIES = ("deepseek_v3", "deepseek_v2")
MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gpt_oss", *LATENT_FAMILIES)
# llama.cpp's llama and olmoe read the experts' width from feed_forward_length.
_EXPERT_WIDTH_KEY = ("qwen2_moe", "qwen3_moe", "gpt_oss", *LATENT_FAMILIES)
# mlx-lm's absorbed MLA holds llama.cpp's split kv_b halves as they are stored.
_LATENT_TENSORS = {"self_attn.embed_q": "attn_k_b", "self_attn.unembed_out": "attn_v_b",
                   "mlp.gate.e_score_correction_bias": "exp_probs_b"}
# gpt-oss files as llama.cpp's converter writes them from OpenAI's checkpoints.
MXFP4_EXPERTS = {"ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"}
# llama.cpp's converter: HF's per-expert matrices, stacked, are these GGUF tensors.
_EXPERT_TENSORS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                   "down_proj": "ffn_down_exps"}
# llama-quantize keeps routers in float and falls back to a 32-block type for rows that
# are no multiple of a K-quant's 256-weight super-block.
_FLOAT_TENSORS = ("ffn_gate_inp", "ffn_gate_inp_shexp")
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
# Config values llama.cpp cannot store and instead fixes (Gemma's query scale is
# 1/sqrt(head_dim) below 27B; Gemma 3 windows all but every 6th layer; SmolLM3 skips
# RoPE on every 4th layer).
FAMILY_GGUF_OVERRIDES = {
    "gemma2": dict(query_pre_attn_scalar=64),
    "gemma3_text": dict(query_pre_attn_scalar=64, num_hidden_layers=6,
                        sliding_window_pattern=6),
    "smollm3": dict(no_rope_layer_interval=4),
    "qwen3_moe": dict(mlp_only_layers=[]),  # llama.cpp runs every qwen3moe layer as MoE
}


def family_source(family: str, **overrides: Any) -> Path:
    """The float32 mlx-lm checkpoint a family GGUF is converted from."""
    from tests.family_models import cached_family_model

    return cached_family_model(family, **{**FAMILY_GGUF_OVERRIDES.get(family, {}), **overrides})


def make_family_gguf(path: str | Path, family: str, qtype: str = "F32", *,
                     tensor_types: dict[str, str] | None = None, **overrides: Any) -> Path:
    """Convert `family_source(family, **overrides)` to a GGUF at `path` the way llama.cpp's
    converter does (names from gguf's tensor map, Q/K permutation, norm offset,
    metadata keys); 2-D weights as `qtype` unless `tensor_types` names the tensor."""
    import gguf
    from safetensors.numpy import load_file

    src = family_source(family, **overrides)
    config = json.loads((src / "config.json").read_text())
    weights = {}
    for file in sorted(src.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    arch, member, permute, norm_offset = FAMILY_ARCHS[family]
    writer = gguf.GGUFWriter(str(path), arch)
    _write_family_hparams(writer, family, config)
    _write_tokenizer(writer, src, config, "gpt2")
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, member),
                                     config["num_hidden_layers"])
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for hf_name in [n for n in weights if n.endswith("self_attn.kv_b_proj.weight")]:
        # llama.cpp's converter: per head, the first nope rows are K (stored transposed),
        # the next v rows V.
        layer, kv_b = hf_name.split(".")[2], weights.pop(hf_name)
        split = kv_b.reshape(config["num_attention_heads"], -1, kv_b.shape[-1])
        nope = config["qk_nope_head_dim"]
        weights[f"model.layers.{layer}.self_attn.embed_q.weight"] = np.ascontiguousarray(
            split[:, :nope].swapaxes(1, 2))
        weights[f"model.layers.{layer}.self_attn.unembed_out.weight"] = split[:, nope:]
    for hf_name, array in sorted(weights.items()):
        name = gguf_tensor_name(names, hf_name)
        kind = name.rsplit(".", 2)[-2]
        if permute and kind in heads:
            array = llama_cpp_permute(array, heads[kind])
        if norm_offset and hf_name.endswith("norm.weight"):
            array = array + 1.0
        if kind == "ffn_gate_inp_shexp":
            array = array.reshape(-1)  # llama.cpp declares it [n_embd]
        matrix = array.ndim >= 2 and name.endswith(".weight") and kind not in _FLOAT_TENSORS
        chosen = (tensor_types or {}).get(name, qtype if matrix else "F32")
        if chosen in _K_FALLBACK and array.shape[-1] % 256:
            chosen = _K_FALLBACK[chosen]
        _add_tensor(writer, name, array, chosen)
    scaling = config.get("rope_scaling") or {}
    if family == "phi3" and scaling.get("type") == "longrope":
        _add_tensor(writer, "rope_factors_long.weight", np.array(scaling["long_factor"]), "F32")
        _add_tensor(writer, "rope_factors_short.weight", np.array(scaling["short_factor"]),
                    "F32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def gguf_tensor_name(names, mlx_name: str) -> str:
    """The GGUF tensor an mlx-lm checkpoint parameter is written as (its stacked experts
    `...switch_mlp.gate_proj.weight` as llama.cpp's `blk.N.ffn_gate_exps.weight`)."""
    for mlx, kind in _LATENT_TENSORS.items():
        if f".{mlx}" in mlx_name:
            layer = mlx_name.split(".")[2]
            suffix = "bias" if kind == "exp_probs_b" else mlx_name.rsplit(".", 1)[-1]
            return f"blk.{layer}.{kind}.{suffix}"
    if ".switch_mlp." in mlx_name:
        _, _, layer, rest = mlx_name.split(".", 3)
        projection, suffix = rest.split(".switch_mlp.")[1].split(".")
        return f"blk.{layer}.{_EXPERT_TENSORS[projection]}.{suffix}"
    name = names.get_name(mlx_name, try_suffixes=(".weight", ".bias"))
    # A bare parameter (gpt-oss's `self_attn.sinks`): the converter adds ".weight".
    return name if name.endswith((".weight", ".bias")) else f"{name}.weight"


def recipe_types(family: str, recipe: dict[str, str], **overrides: Any) -> dict[str, str]:
    """`tensor_types` for `make_family_gguf`: GGUF 2-D tensor name -> type for the
    tensors whose kind (`attn_v`, `ffn_down`, `output`, ...) `recipe` names."""
    import gguf
    from safetensors.numpy import load_file

    src = family_source(family, **overrides)
    config = json.loads((src / "config.json").read_text())
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, FAMILY_ARCHS[family][1]),
                                     config["num_hidden_layers"])
    types = {}
    for file in src.glob("*.safetensors"):
        for hf_name, array in load_file(str(file)).items():
            name = gguf_tensor_name(names, hf_name)
            if array.ndim >= 2 and name.endswith(".weight") and name.rsplit(".", 2)[-2] in recipe:
                types[name] = recipe[name.rsplit(".", 2)[-2]]
    return types


def _write_latent_hparams(writer, family: str, config: dict[str, Any]) -> None:
    """DeepseekV2Model.set_gguf_parameters in llama.cpp's converter."""
    rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    writer.add_key_length(rank + rope)
    writer.add_value_length(rank)
    writer.add_key_length_mla(config["qk_nope_head_dim"] + rope)
    writer.add_value_length_mla(config["v_head_dim"])
    writer.add_kv_lora_rank(rank)
    if config.get("q_lora_rank"):
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_rope_dimension_count(rope)
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config.get("routed_scaling_factor", 1.0))
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    if config.get("scoring_func") == "sigmoid":
        import gguf

        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if config.get("n_group"):
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") == "yarn":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * scaling["mscale_all_dim"])


def _write_family_hparams(writer, family: str, config: dict[str, Any]) -> None:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(1 if family in LATENT_FAMILIES else config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    if family == "starcoder2":
        writer.add_layer_norm_eps(config["norm_epsilon"])
    else:
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if family in LATENT_FAMILIES:
        _write_latent_hparams(writer, family, config)
    elif family not in ("phi3",):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if family == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config.get("sliding_window") or 4096)
    if family == "gemma3_text" and config["sliding_window_pattern"] != 1:
        writer.add_sliding_window(config["sliding_window"])
    if family == "phi3":
        writer.add_rope_dimension_count(
            int(config.get("partial_rotary_factor", 1.0) * hidden) // heads)
        writer.add_rope_scaling_orig_ctx_len(
            config.get("original_max_position_embeddings", config["max_position_embeddings"]))
        writer.add_sliding_window(config.get("sliding_window") or 0)
    if family in MOE_FAMILIES:
        writer.add_expert_count(config.get("num_experts") or config.get("n_routed_experts")
                                or config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if family in _EXPERT_WIDTH_KEY:
        writer.add_expert_feed_forward_length(config.get("moe_intermediate_size")
                                              or config["intermediate_size"])
    if family == "gpt_oss":
        writer.add_sliding_window(config["sliding_window"])
    if family == "qwen2_moe":
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if family == "granite":
        writer.add_attention_scale(config["attention_multiplier"])
        writer.add_embedding_scale(config["embedding_multiplier"])
        writer.add_residual_scale(config["residual_multiplier"])
        writer.add_logit_scale(config["logits_scaling"])
