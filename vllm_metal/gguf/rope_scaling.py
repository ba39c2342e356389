"""HF `rope_scaling` from GGUF: metadata keys (linear, yarn) or a `rope_freqs` tensor (llama3).

llama.cpp does not store Llama 3's rope parameters; it stores their effect, one divisor per
frequency pair (`rope_freqs.weight`, [head_dim / 2]). The parameters are recovered by fitting
the llama3 formula to that tensor. The fit is unique up to the choice of the original context
length, which only rescales low/high_freq_factor; the recovered dict reproduces the tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Llama 3's own original context; any value gives the same frequencies (see module doc).
_LLAMA3_ORIGINAL_CONTEXT = 8192
_FIT_RTOL = 1e-4


def rope_scaling_from_gguf(
    metadata: dict[str, Any], arch: str, rope_freqs: np.ndarray | None, dims: int, base: float,
) -> dict[str, Any] | None:
    """HF rope_scaling dict (or None) for `arch`; `rope_freqs`: float [dims / 2] or None."""
    prefix = f"{arch}.rope.scaling."
    kind = metadata.get(prefix + "type", "none")
    if rope_freqs is not None:
        if kind not in ("none", "llama3"):
            raise ValueError(
                f"GGUF has both rope_freqs.weight and {prefix}type={kind!r}; "
                "only one rope scaling can be applied")
        return llama3_from_rope_freqs(rope_freqs, dims, base)
    if kind == "none":
        return None
    factor = metadata.get(prefix + "factor")
    if factor is None:
        raise ValueError(f"GGUF sets {prefix}type={kind!r} but no {prefix}factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        original = metadata.get(prefix + "original_context_length")
        if original is None:
            raise ValueError(f"GGUF yarn rope scaling needs {prefix}original_context_length")
        scaling = {"rope_type": "yarn", "factor": float(factor),
                   "original_max_position_embeddings": int(original)}
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                                 ("attn_factor", "attention_factor")):
            if prefix + gguf_key in metadata:
                scaling[hf_key] = float(metadata[prefix + gguf_key])
        return scaling
    raise ValueError(
        f"GGUF rope scaling type {kind!r} is not supported (supported: none, linear, yarn, "
        "and llama3 via rope_freqs.weight)")


def llama3_divisors(dims: int, base: float, scaling: dict[str, Any]) -> np.ndarray:
    """float64 [dims / 2]: what each RoPE wavelength is multiplied by under llama3 scaling."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    smooth = (original / wavelen - low) / (high - low)
    medium = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen > original / low, factor, 1.0)
    return np.where((wavelen > original / high) & (wavelen < original / low), medium, out)


def llama3_from_rope_freqs(rope_freqs: np.ndarray, dims: int, base: float) -> dict[str, Any] | None:
    """Recover llama3 rope_scaling from llama.cpp's per-frequency divisors [dims / 2]."""
    divisors = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    if divisors.shape != (dims // 2,):
        raise ValueError(
            f"rope_freqs.weight has {divisors.size} entries, expected head_dim/2 = {dims // 2}")
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0, rtol=_FIT_RTOL, atol=0):
        return None
    wavelen = 2 * np.pi * base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    medium = (divisors > 1 + _FIT_RTOL) & (divisors < factor * (1 - _FIT_RTOL))
    if medium.sum() < 2:
        raise ValueError(
            "cannot recover llama3 rope scaling from rope_freqs.weight: fewer than two "
            "frequencies lie between the scaled and unscaled bands")
    # Inside the band the smoothing weight is linear in 1/wavelen: s = a / wavelen + b.
    smooth = (factor / divisors[medium] - 1) / (factor - 1)
    a, b = np.polyfit(1.0 / wavelen[medium], smooth, 1)
    original = _LLAMA3_ORIGINAL_CONTEXT
    span = original / a
    low = -b * span
    for digits in (4, None):  # prefer round values when they reproduce the tensor
        def fix(x: float) -> float:
            return float(round(x, digits) if digits else x)

        scaling = {
            "rope_type": "llama3",
            "factor": fix(factor),
            "low_freq_factor": fix(low),
            "high_freq_factor": fix(low + span),
            "original_max_position_embeddings": original,
        }
        if scaling["low_freq_factor"] > 0 and np.allclose(
                llama3_divisors(dims, base, scaling), divisors, rtol=_FIT_RTOL, atol=0):
            return scaling
    raise ValueError("rope_freqs.weight does not follow the llama3 rope scaling formula")
