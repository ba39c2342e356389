"""GGUF tensors -> mlx-lm parameters: names, Q/K row order, and per-module quantization.

`mx.load` hands Q4_0/Q4_1/Q8_0 tensors back as MLX affine triples (`.weight` uint32
[out, in * bits / 32], `.scales` and `.biases` [out, in / 32]); they stay quantized.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from vllm_metal.gguf.header import GGML_TYPE_NAMES, GGUFHeader

GROUP_SIZE = 32  # every GGUF block type MLX converts has 32 weights per block
QUANTIZED_BITS = {2: 4, 3: 4, 8: 8}  # GGML type id (Q4_0, Q4_1, Q8_0) -> bits
DENSE_TYPES = (0, 1, 30)  # F32, F16, BF16
SUPPORTED_TYPES = tuple(GGML_TYPE_NAMES[t] for t in (*DENSE_TYPES, *QUANTIZED_BITS))

# Tensors that configure the model rather than being parameters of it.
CONFIG_TENSORS = ("rope_freqs.weight",)

_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_PER_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_NAME = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)$")


def check_tensor_types(header: GGUFHeader) -> None:
    """Refuse the file if any tensor has a GGML type we cannot load exactly."""
    bad = [t for t in header.tensors.values()
           if t.ggml_type not in DENSE_TYPES and t.ggml_type not in QUANTIZED_BITS]
    if bad:
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise ValueError(
            f"GGUF tensor {bad[0].name!r} has type {bad[0].type_name}{more}; vllm-metal loads "
            f"only {', '.join(SUPPORTED_TYPES)}. Re-quantize the model to one of these "
            "(e.g. `llama-quantize --allow-requantize in.gguf out.gguf Q8_0`).")


def mlx_name(gguf_name: str) -> str:
    """mlx-lm parameter name for a GGUF tensor name (`blk.3.attn_q.scales` ->
    `model.layers.3.self_attn.q_proj.scales`)."""
    match = _NAME.match(gguf_name)
    table = _PER_LAYER if match and match.group(1) is not None else _TOP_LEVEL
    if match is None or match.group(2) not in table:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in the supported models")
    layer, base, suffix = match.groups()
    prefix = f"model.layers.{layer}." if layer is not None else ""
    return f"{prefix}{table[base]}.{suffix}"


def unpermute_rows(array: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row order. [rows, ...] -> [rows, ...], rows = n_heads * head_dim.

    The converter interleaves each head's two rotary halves (row h*d + 2*i + j holds
    HF row h*d + j*d/2 + i) for its interleaved RoPE; MLX uses HF's half-split RoPE.
    Rows are whole output rows, so packed weights, scales and biases permute alike.
    """
    rows = array.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    split = array.reshape(n_heads, rows // n_heads // 2, 2, *array.shape[1:])
    return split.swapaxes(1, 2).reshape(array.shape)


def convert_weights(
    header: GGUFHeader, tensors: Mapping[str, mx.array], config: dict[str, Any],
) -> tuple[dict[str, mx.array], dict[str, dict[str, int]]]:
    """(mlx-lm name -> array, quantized module path -> {"group_size", "bits"}).

    `tensors`: GGUF names as `mx.load` returns them (quantized ones split into
    `.weight/.scales/.biases`); `config`: `hf_config_from_gguf` of the same file.
    """
    # llama.cpp permutes Q/K only for architectures it runs with interleaved RoPE.
    permute_heads = {}
    if config["model_type"] == "llama":
        permute_heads = {"attn_q": config["num_attention_heads"],
                         "attn_k": config["num_key_value_heads"]}
    weights: dict[str, mx.array] = {}
    for name, array in tensors.items():
        if name in CONFIG_TENSORS:
            continue
        base = name.rsplit(".", 1)[0]
        heads = permute_heads.get(base.rsplit(".", 1)[-1])
        weights[mlx_name(name)] = unpermute_rows(array, heads) if heads else array
    return weights, _quantization(header, tensors)


def _quantization(
    header: GGUFHeader, tensors: Mapping[str, mx.array],
) -> dict[str, dict[str, int]]:
    spec = {}
    for info in header.tensors.values():
        bits = QUANTIZED_BITS.get(info.ggml_type)
        if bits is None:
            continue
        base = info.name.removesuffix(".weight")
        in_features = info.shape[-1]
        packed, scales = tensors[info.name], tensors.get(base + ".scales")
        # The header's logical shape must agree with the packed layout MLX produced.
        if (scales is None or packed.shape[-1] * 32 // bits != in_features
                or scales.shape[-1] * GROUP_SIZE != in_features):
            raise ValueError(
                f"GGUF tensor {info.name!r} ({info.type_name}, shape {info.shape}) did not "
                "load as an MLX affine-quantized triple")
        spec[mlx_name(info.name).removesuffix(".weight")] = {
            "group_size": GROUP_SIZE, "bits": bits}
    return spec
