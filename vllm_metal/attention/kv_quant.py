"""Quantized KV caches: vLLM's ``--kv-cache-dtype`` names and the layout the
native ops read and write (csrc/kv_quant.h).

A quantized cache is uint8 [num_blocks, block_size, num_kv_heads, head_dim + 4]:
each (token, KV head) row holds head_dim one-byte codes and then its float32
scale, ``max|x| / largest code``, set when the row is written. Every format
scales per token and head, computed as the row is written: vLLM's ``fp8`` on
CUDA scales per tensor (1.0 unless a checkpoint ships scales), which a row
scale never does worse than, and needs no calibration.

``turboquant_4bit_nc`` (format ``rot4``, rotated_kv.py defines it) packs two
4-bit codes a byte instead: rows of head_dim / 2 + 4 bytes, keys rotated.
``turboquant_k8v4`` (``k8v4``) keeps e4m3 key rows and such 4-bit value rows, so
its K and V caches differ in their last dimension (csrc/kv_quant.h has the
layouts).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

SCALE_BYTES = 4


@dataclass(frozen=True)
class KvQuant:
    """One code format: ``code`` is the native ops' ``kv_quant`` argument."""

    name: str
    code: int
    key_nibbles: bool = False    # key rows hold two 4-bit codes a byte
    value_nibbles: bool = False  # value rows do

    @property
    def packed(self) -> bool:
        """Some rows hold 4-bit codes: only the pieces kernel reads them
        (PACKED_HEAD_SIZES)."""
        return self.key_nibbles or self.value_nibbles

    @property
    def description(self) -> str:
        """What a row holds, for logs."""
        if self.key_nibbles:
            return "rotated 4-bit keys and 4-bit values per token and head"
        if self.value_nibbles:
            return "e4m3 keys with a float32 scale and 4-bit values per token and head"
        return f"{self.name} codes with a float32 scale per token and head"

    def key_width(self, head_dim: int) -> int:
        """The key cache's last dimension (bytes) for head_dim elements."""
        return (head_dim // 2 if self.key_nibbles else head_dim) + SCALE_BYTES

    def value_width(self, head_dim: int) -> int:
        """The value cache's."""
        return (head_dim // 2 if self.value_nibbles else head_dim) + SCALE_BYTES


INT8 = KvQuant("int8", 1)
FP8_E4M3 = KvQuant("fp8_e4m3", 2)
FP8_E5M2 = KvQuant("fp8_e5m2", 3)
ROT4 = KvQuant("rot4", 4, key_nibbles=True, value_nibbles=True)
K8V4 = KvQuant("k8v4", 5, value_nibbles=True)
FORMATS = {q.name: q for q in (INT8, FP8_E4M3, FP8_E5M2, ROT4, K8V4)}

# vLLM's --kv-cache-dtype values this plugin stores quantized.
CACHE_DTYPES = {
    "fp8": FP8_E4M3,
    "fp8_e4m3": FP8_E4M3,
    "fp8_e5m2": FP8_E5M2,
    "fp8_per_token_head": FP8_E4M3,
    "int8_per_token_head": INT8,
    "turboquant_4bit_nc": ROT4,
    "turboquant_k8v4": K8V4,
}

STORAGE_DTYPE = mx.uint8

# Head sizes the formats with 4-bit rows take (csrc/kv_quant.h kv_head_size_ok).
PACKED_HEAD_SIZES = (64, 128, 256)


def from_cache_dtype(cache_dtype: str | None) -> KvQuant | None:
    """The format of a --kv-cache-dtype value (None: a float cache)."""
    return CACHE_DTYPES.get(cache_dtype) if cache_dtype else None


def resolve(kv_quant: KvQuant | str | None) -> KvQuant | None:
    """A KvQuant from itself or its name; ValueError naming the known ones."""
    if kv_quant is None or isinstance(kv_quant, KvQuant):
        return kv_quant
    found = FORMATS.get(kv_quant)
    if found is None:
        raise ValueError(
            f"kv_quant must be one of {', '.join(FORMATS)} or None, got {kv_quant!r}")
    return found
