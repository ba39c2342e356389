"""Read a GGUF file (header + MLX arrays) and derive the HF `config.json` it implies."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from vllm_metal.gguf.header import GGUFHeader, read_header
from vllm_metal.gguf.rope_scaling import rope_scaling_from_gguf
from vllm_metal.gguf.weights import check_tensor_types

# general.architecture -> (HF architecture, HF/mlx-lm model_type).
# Mistral GGUFs are tagged "llama": same layers, and llama.cpp runs them as llama.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

# general.file_type values whose weights are bf16 / f32 (llama_ftype in llama.h).
_FILE_TYPE_BF16, _FILE_TYPE_F32 = 32, 0
_BF16 = 30


@dataclass(frozen=True)
class GGUFFile:
    """A loaded GGUF: `tensors` keyed by GGUF name; quantized ones split into
    `name.weight` (uint32), `name.scales` and `name.biases`."""

    header: GGUFHeader
    tensors: dict[str, mx.array]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def path(self) -> str:
        return self.header.path


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and type-check the header, then load every tensor with `mx.load`."""
    header = read_header(path)
    check_architecture(header.metadata)
    check_tensor_types(header)
    if int(header.metadata.get("split.count", 1)) > 1:
        raise ValueError(
            f"{header.path!r} is one shard of a split GGUF; merge the shards first "
            "(`llama-gguf-split --merge first-shard.gguf merged.gguf`)")
    tensors = mx.load(header.path)
    for info in header.tensors.values():
        if info.ggml_type == _BF16:  # mx.load rounds BF16 through float16; re-read exactly
            tensors[info.name] = mx.array(header.read_dense(info.name)).astype(mx.bfloat16)
    return GGUFFile(header, tensors)


def check_architecture(metadata: dict[str, Any]) -> str:
    """general.architecture, if supported; otherwise a ValueError naming it."""
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported by vllm-metal; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def hf_config_from_gguf(header: GGUFHeader) -> dict[str, Any]:
    """The HF config.json dict for the model in `header` (metadata + tensor table)."""
    md, tensors = header.metadata, header.tensors
    arch = check_architecture(md)
    hf_arch, model_type = SUPPORTED_ARCHITECTURES[arch]

    def get(key: str, default: Any = None) -> Any:
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks required key {arch + '.' + key!r}")
        return _uniform(value, f"{arch}.{key}")

    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF has no token_embd.weight tensor")
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError("GGUF key_length != value_length is not supported")
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(
            f"GGUF rope.dimension_count {rope_dims} != head_dim {head_dim}: partial "
            f"rotary embeddings are not supported for {arch}")
    rope_theta = float(get("rope.freq_base", 10000.0))
    rope_freqs = (header.read_dense("rope_freqs.weight")
                  if "rope_freqs.weight" in tensors else None)

    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling_from_gguf(md, arch, rope_freqs, head_dim, rope_theta),
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": _torch_dtype(header),
    }
    if model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    if model_type in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None,
                      max_window_layers=config["num_hidden_layers"])
    for gguf_name, hf_name in (("bos", "bos"), ("eos", "eos"), ("padding", "pad")):
        token_id = md.get(f"tokenizer.ggml.{gguf_name}_token_id")
        if token_id is not None:
            config[f"{hf_name}_token_id"] = int(token_id)
    return config


def _uniform(value: Any, key: str) -> Any:
    # Some converters write per-layer arrays; these families need one value for all layers.
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise ValueError(f"GGUF {key} varies across layers ({value}); not supported")
        return value[0]
    return value


def _torch_dtype(header: GGUFHeader) -> str:
    file_type = header.metadata.get("general.file_type")
    if file_type == _FILE_TYPE_BF16 or any(t.ggml_type == _BF16 for t in header.tensors.values()):
        return "bfloat16"
    if file_type == _FILE_TYPE_F32 or all(t.ggml_type == 0 for t in header.tensors.values()):
        return "float32"
    return "float16"

