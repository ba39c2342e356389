"""Reading caches of 4-bit rows (``kv_quant="rot4"`` and ``"k8v4"``,
csrc/kv_quant.h) in numpy: the bytes the native writer leaves, unpacked into the
codecs' terms (tests/ops/rotated_kv_np.py, tests/ops/kv_quant_np.py) and decoded in
float64."""

from __future__ import annotations

import numpy as np

from tests.ops import rotated_kv_np as codec
from tests.ops.kv_quant_np import read_cache
from vllm_metal.attention.rotated_kv import hadamard, lloyd_max_levels


def nibbles(rows: np.ndarray, d: int) -> np.ndarray:
    """uint8 [..., d]: the 4-bit codes of rows [..., >= d / 2] (low nibble first)."""
    packed = rows[..., :d // 2]
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], d)


def key_rows(cache: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(index uint8 [..., d], factor float32 [...]) of key rows [..., d / 2 + 4]."""
    tail = np.ascontiguousarray(cache[..., d // 2:d // 2 + 4])
    return nibbles(cache, d), tail.view(np.float32)[..., 0]


def value_rows(cache: np.ndarray, d: int) -> codec.ValueCodes:
    """The value codes of rows [..., d / 2 + 4]: codes, then float16 step and minimum."""
    tail = np.ascontiguousarray(cache[..., d // 2:d // 2 + 4]).view(np.float16)
    return codec.ValueCodes(nibbles(cache, d), tail[..., 0], tail[..., 1])


def decoded_keys(cache: np.ndarray, d: int, fmt: str = "rot4") -> np.ndarray:
    """float64 [..., d]: the keys a cache's rows stand for (rot4: rotated back; its
    stored factor is norm / |levels picked| for the levels of N(0, 1), so it
    multiplies those, the levels of N(0, 1/d) times sqrt(d); k8v4: e4m3 codes
    times the row's scale)."""
    if fmt == "k8v4":
        values, scales = read_cache(cache, d, "fp8_e4m3")
        return values * scales[..., None].astype(np.float64)
    index, factor = key_rows(cache, d)
    unit_levels = lloyd_max_levels(d, 4) * np.sqrt(d)
    return (unit_levels[index] * factor.astype(np.float64)[..., None]) @ hadamard(d)


def decoded_values(cache: np.ndarray, d: int) -> np.ndarray:
    """float64 [..., d]."""
    return codec.decode_values(value_rows(cache, d))
