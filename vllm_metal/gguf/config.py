"""The HF `config.json` a GGUF file implies (metadata + tensor table)."""

from __future__ import annotations

from typing import Any

from vllm_metal.gguf.architectures import Metadata, architecture_of
from vllm_metal.gguf.header import GGUFHeader
from vllm_metal.gguf.rope_scaling import rope_scaling_from_gguf

# general.file_type values whose weights are bf16 / f32 (llama_ftype in llama.h).
_FILE_TYPE_BF16, _FILE_TYPE_F32 = 32, 0
_BF16 = 30


def check_architecture(metadata: dict[str, Any]) -> str:
    """general.architecture, if supported; otherwise a ValueError naming it."""
    return architecture_of(metadata)[0]


def hf_config_from_gguf(header: GGUFHeader) -> dict[str, Any]:
    """The HF config.json dict for the model in `header`."""
    arch, spec = architecture_of(header.metadata)
    md = Metadata(header.metadata, arch, header.tensors)
    tensors = header.tensors
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF has no token_embd.weight tensor")
    hidden = int(md.uniform("embedding_length"))
    heads = int(md.uniform("attention.head_count"))
    head_dim = int(md.uniform("attention.key_length", hidden // heads))
    if not spec.latent and int(md.uniform("attention.value_length", head_dim)) != head_dim:
        raise ValueError("GGUF key_length != value_length is not supported")
    rope_theta = float(md.uniform("rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "architectures": [spec.hf_architecture],
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "intermediate_size": _feed_forward(md),
        "num_hidden_layers": int(md.uniform("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(md.uniform("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": spec.hidden_act,
        "rope_theta": rope_theta,
        "max_position_embeddings": int(md.uniform("context_length")),
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": _torch_dtype(header),
    }
    if spec.layer_norm:
        config["norm_epsilon"] = float(md.uniform("attention.layer_norm_epsilon"))
    else:
        config["rms_norm_eps"] = float(md.uniform("attention.layer_norm_rms_epsilon"))
    if not spec.latent:  # a latent family's extra states its own head and RoPE sizes
        config.update(_rope(header, md, head_dim, rope_theta))
    if spec.extra is not None:
        config.update(spec.extra(md, config))
    for gguf_name, hf_name in (("bos", "bos"), ("eos", "eos"), ("padding", "pad")):
        token_id = header.metadata.get(f"tokenizer.ggml.{gguf_name}_token_id")
        if token_id is not None:
            config[f"{hf_name}_token_id"] = int(token_id)
    return config


def _feed_forward(md: Metadata) -> int:
    """The dense MLP width; a MoE file without one states only its experts' width."""
    width = md.uniform("feed_forward_length", None)
    if width is None and md.get("expert_count", None):
        width = md.uniform("expert_feed_forward_length")
    return int(width if width is not None else md.uniform("feed_forward_length"))


def _rope(header: GGUFHeader, md: Metadata, head_dim: int, base: float) -> dict[str, Any]:
    rope_dims = int(md.uniform("rope.dimension_count", head_dim))
    factors = [n for n in ("rope_factors_long.weight", "rope_factors_short.weight")
               if n in header.tensors]
    if md.arch == "phi3":
        rope = {"partial_rotary_factor": rope_dims / head_dim} if rope_dims != head_dim else {}
        if factors:  # LongRoPE: one divisor per frequency pair for long and short contexts
            if len(factors) != 2:
                raise ValueError(f"GGUF phi3 file has {factors[0]!r} without its pair")
            long, short = (header.read_dense(n).reshape(-1).tolist() for n in factors)
            rope["rope_scaling"] = {"type": "longrope", "long_factor": long,
                                    "short_factor": short}
        else:
            rope["rope_scaling"] = None
        return rope
    if factors:
        raise ValueError(f"GGUF {md.arch} file has LongRoPE factors ({factors[0]!r}); "
                         f"not supported for {md.arch}")
    if rope_dims != head_dim:
        raise ValueError(
            f"GGUF rope.dimension_count {rope_dims} != head_dim {head_dim}: partial "
            f"rotary embeddings are not supported for {md.arch}")
    rope_freqs = (header.read_dense("rope_freqs.weight")
                  if "rope_freqs.weight" in header.tensors else None)
    return {"rope_scaling": rope_scaling_from_gguf(header.metadata, md.arch, rope_freqs,
                                                   head_dim, base)}


def _torch_dtype(header: GGUFHeader) -> str:
    file_type = header.metadata.get("general.file_type")
    if file_type == _FILE_TYPE_BF16 or any(t.ggml_type == _BF16 for t in header.tensors.values()):
        return "bfloat16"
    if file_type == _FILE_TYPE_F32 or all(t.ggml_type == 0 for t in header.tensors.values()):
        return "float32"
    return "float16"
