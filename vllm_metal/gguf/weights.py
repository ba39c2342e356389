"""GGUF tensors -> an mlx-lm model's parameters, by the model's own parameter names.

Each parameter of the instantiated mlx-lm model is looked up in llama.cpp's tensor name
table (the `gguf` package's `TensorNameMap`, the converter's own), so a family loads
with no name table of ours. The converter's transforms are undone on the way in (Q/K
row order, Gemma's norm offset). A tensor the model has no place for, or a parameter
the file lacks, refuses the file by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from vllm_metal.gguf.architectures import Architecture
from vllm_metal.gguf.header import GGUFHeader
from vllm_metal.gguf.quants import (
    DENSE_TYPES, GROUP_SIZE, QUANTIZED_TYPES, SUPPORTED_TYPES, MLXTensor, byte_size, to_mlx,
)

# A decoder layer's parameters: model.layers.N.* (mlx-lm's names).
LAYER_PARAMETER = re.compile(r"\blayers\.(\d+)\.")
# Tensors that configure the model (read into config.json) rather than parameterize it.
CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def check_tensor_types(header: GGUFHeader) -> None:
    """Refuse the file if any tensor has a GGML type we cannot load."""
    bad = [t for t in header.tensors.values()
           if t.ggml_type not in DENSE_TYPES and t.ggml_type not in QUANTIZED_TYPES]
    if bad:
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise ValueError(
            f"GGUF tensor {bad[0].name!r} has type {bad[0].type_name}{more}; vllm-metal loads "
            f"only {', '.join(SUPPORTED_TYPES)}. Use a file of one of these types (Q4_K_M, "
            "Q5_K_M, Q6_K and Q8_0 files are), or re-quantize: `llama-quantize "
            "--allow-requantize in.gguf out.gguf Q4_K_M`.")


def unpermute_rows(array: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row order. [rows, ...] -> [rows, ...], rows = n_heads * head_dim.

    The converter interleaves each head's two rotary halves (row h*d + 2*i + j holds
    HF row h*d + j*d/2 + i) for its pairwise RoPE; MLX uses HF's half-split RoPE.
    Rows are whole output rows, so packed weights, scales and biases permute alike.
    """
    rows = array.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    split = array.reshape(n_heads, rows // n_heads // 2, 2, *array.shape[1:])
    return split.swapaxes(1, 2).reshape(array.shape)


# mlx-lm's spellings the name table does not know -> HF spellings it does: stacked
# experts (`switch_mlp`), absorbed MLA's per-head matrices, DeepSeek V3's selection bias.
_EXPERT_SPELLINGS = {"gate_proj": ("gate_proj", "w1"), "up_proj": ("up_proj", "w3"),
                     "down_proj": ("down_proj", "w2")}
_MODULE_SPELLINGS = {"self_attn.embed_q": "self_attn.k_b_proj",
                     "self_attn.unembed_out": "self_attn.v_b_proj"}
_PARAM_SPELLINGS = {"gate.e_score_correction_bias": ("gate.e_score_correction", "bias")}


def _tensor_name(names, header: GGUFHeader, param: str) -> tuple[str | None, str | None]:
    """(GGUF tensor name or None, its base `blk.N.kind` or None) of an mlx-lm parameter."""
    module, suffix = param.rsplit(".", 1)
    candidates = [module]
    owner, _, rest = module.partition(".switch_mlp.")
    if rest:
        candidates = [f"{owner}.experts.{s}" for s in _EXPERT_SPELLINGS.get(rest, ())]
    for mlx, hf in _MODULE_SPELLINGS.items():
        if module.endswith(mlx):
            candidates = [module[:-len(mlx)] + hf]
    for mlx, (hf, hf_suffix) in _PARAM_SPELLINGS.items():
        if param.endswith(mlx):
            candidates, suffix = [param[:-len(mlx)] + hf], hf_suffix
    for candidate in candidates:
        base = names.get_name(candidate)
        if base and f"{base}.{suffix}" in header.tensors:
            return f"{base}.{suffix}", base
    base = names.get_name(param)
    if base and f"{base}.weight" in header.tensors:
        # A bare parameter (gpt-oss's `self_attn.sinks`): the converter adds ".weight".
        return f"{base}.weight", base
    base = names.get_name(candidates[0]) if candidates else None
    return (f"{base}.{suffix}" if base else None), base


def _converted(header: GGUFHeader, info) -> MLXTensor:
    """One tensor as MLX parameters; a stack of experts [E, N, K] converts as E * N rows
    and keeps its leading expert axis."""
    raw = header.read_raw(info.name, byte_size(info.ggml_type, info.shape))
    if len(info.shape) != 3 or info.ggml_type in DENSE_TYPES:
        return to_mlx(raw, info.ggml_type, info.shape)
    experts, rows, cols = info.shape
    flat = to_mlx(raw, info.ggml_type, (experts * rows, cols))
    return MLXTensor({k: a.reshape(experts, rows, -1) for k, a in flat.arrays.items()},
                     flat.bits, flat.mode)


def _squeezed_to(array: mx.array, shape: tuple[int, ...], tensor: str) -> mx.array:
    """A dense tensor stored without the parameter's unit axes (llama.cpp declares
    qwen2moe's shared-expert gate [n_embd], mlx-lm holds it [1, n_embd])."""
    if [d for d in array.shape if d != 1] != [d for d in shape if d != 1]:
        raise ValueError(f"GGUF tensor {tensor!r} has shape {tuple(array.shape)}; the model "
                         f"expects {tuple(shape)}")
    return array.reshape(shape)


def _kv_b(header: GGUFHeader, names, module: str, config: dict[str, Any],
          used: set[str]) -> mx.array:
    """DeepSeek-V2's expanded kv_b_proj [heads * (nope + v), kv_lora] from llama.cpp's
    split halves: attn_k_b [heads, kv_lora, nope] (transposed) and attn_v_b [heads, v,
    kv_lora]. Quantized halves are quantized along different axes than kv_b's rows, so
    the (small) matrix is rebuilt in float from their exact values."""
    base = names.get_name(module)
    legacy = f"{base}.weight"
    if legacy in header.tensors:
        used.add(legacy)
        return _dense(header, legacy)
    k_b = names.get_name(module.replace("kv_b_proj", "k_b_proj")) + ".weight"
    v_b = names.get_name(module.replace("kv_b_proj", "v_b_proj")) + ".weight"
    for tensor in (k_b, v_b):
        if tensor not in header.tensors:
            raise ValueError(f"GGUF file has no tensor {tensor!r} for the "
                             f"{config['model_type']} model's {module!r}")
    used.update((k_b, v_b))
    keys = _dense(header, k_b).swapaxes(1, 2)  # [heads, nope, kv_lora]
    values = _dense(header, v_b)  # [heads, v, kv_lora]
    joined = mx.concatenate([keys, values], axis=1)
    return joined.reshape(-1, joined.shape[-1])


def _dense(header: GGUFHeader, tensor: str) -> mx.array:
    """A tensor's exact float32 values, quantized or not."""
    info = header.tensors[tensor]
    converted = _converted(header, info)
    if converted.bits is None:
        return converted.arrays["weight"].astype(mx.float32)
    arrays = converted.arrays
    return mx.dequantize(arrays["weight"], arrays["scales"], arrays.get("biases"),
                         group_size=GROUP_SIZE, bits=converted.bits, mode=converted.mode,
                         dtype=mx.float32)


def gguf_weights(
    header: GGUFHeader, model: nn.Module, spec: Architecture, config: dict[str, Any],
    unread_layers: frozenset[int] = frozenset(),
) -> Iterator[tuple[int | None, dict[str, mx.array], dict[str, dict[str, int]]]]:
    """Yields (layer index, parameter name -> array, quantized module path ->
    {"group_size", "bits", "mode"}) for each decoder layer in turn, then (None, ...) for
    the parameters outside the layers: a layer's tensors are read when it is yielded.
    Raises once the last is yielded if a tensor of the file found no place.

    `model`: the unquantized mlx-lm model built from `config` (its parameter names are
    HF's, which the name table knows). `unread_layers`: layers cut from the model (a
    pipeline stage's others), whose tensors are left unread.
    """
    import gguf

    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, spec.gguf_arch),
                                     config["num_hidden_layers"])
    used = set(CONFIG_TENSORS)
    groups: dict[int | None, list[tuple[str, mx.array]]] = {}
    for param, value in tree_flatten(model.parameters()):
        found = LAYER_PARAMETER.search(param)
        groups.setdefault(int(found.group(1)) if found else None, []).append((param, value))
    for index in sorted((i for i in groups if i is not None)) + [None]:
        weights: dict[str, mx.array] = {}
        quantization: dict[str, dict[str, int]] = {}
        for param, value in groups.get(index, []):
            _convert_parameter(header, names, spec, config, param, value, used, weights,
                               quantization)
        yield index, weights, quantization
    cut = tuple(f"blk.{i}." for i in sorted(unread_layers))   # llama.cpp's layer names
    unused = sorted(t for t in set(header.tensors) - used if not t.startswith(cut))
    if unused:
        raise ValueError(
            f"GGUF tensor {unused[0]!r} has no place in mlx-lm's {config['model_type']} model "
            f"({len(unused)} such tensors); the file is not a plain "
            f"{header.metadata.get('general.architecture')} model")


def _convert_parameter(header: GGUFHeader, names, spec: Architecture, config: dict[str, Any],
                       param: str, value: mx.array, used: set[str],
                       weights: dict[str, mx.array],
                       quantization: dict[str, dict[str, int]]) -> None:
    """Reads the tensor of one parameter into ``weights`` (and its module's quantization
    into ``quantization``), the tensor's name into ``used``."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    module, suffix = param.rsplit(".", 1)
    if module.endswith("self_attn.kv_b_proj"):
        weights[param] = _kv_b(header, names, module, config, used)
        return
    tensor, base = _tensor_name(names, header, param)
    if tensor not in header.tensors:
        raise ValueError(
            f"GGUF file has no tensor for the {config['model_type']} model's parameter "
            f"{param!r}" + (f" (looked for {tensor!r})" if tensor else ""))
    used.add(tensor)
    info = header.tensors[tensor]
    converted = _converted(header, info)
    arrays = converted.arrays
    if converted.bits is None and arrays["weight"].shape != value.shape:
        arrays = {"weight": _squeezed_to(arrays["weight"], value.shape, tensor)}
    kind = base.rsplit(".", 1)[-1]
    if spec.pairwise_rope and kind in heads:
        arrays = {k: unpermute_rows(a, heads[kind]) for k, a in arrays.items()}
    if spec.norm_offset and param.endswith("norm.weight"):
        arrays = {"weight": arrays["weight"].astype(mx.float32) - spec.norm_offset}
    if converted.bits is not None:
        if suffix != "weight":
            raise ValueError(f"GGUF tensor {tensor!r} is {info.type_name}; only weight "
                             "matrices may be quantized")
        quantization[module] = {"group_size": GROUP_SIZE, "bits": converted.bits,
                                "mode": converted.mode}
    for key, array in arrays.items():
        weights[f"{module}.{key}" if key != "weight" else param] = array
