"""Independent numpy codec of the quantized KV formats, written from the formats'
definitions (OCP e4m3fn / e5m2 minifloats, symmetric int8): each code's value by
its sign, exponent and mantissa fields, and quantization as a search for the
nearest finite code (ties to the even code), not the kernels' bit arithmetic."""

from __future__ import annotations

import numpy as np

LARGEST = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
_FIELDS = {"fp8_e4m3": (3, 7), "fp8_e5m2": (2, 15)}


def code_values(fmt: str) -> np.ndarray:
    """float64 [256]: each code's value; NaN for codes that are not finite numbers."""
    codes = np.arange(256)
    if fmt == "int8":
        values = codes.astype(np.uint8).view(np.int8).astype(np.float64)
        values[0x80] = np.nan  # -128: never written (the range is symmetric)
        return values
    mant, bias = _FIELDS[fmt]
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> mant) & ((1 << (7 - mant)) - 1)
    fraction = (codes & ((1 << mant) - 1)) / 2.0**mant
    values = sign * np.where(exponent == 0, fraction * 2.0 ** (1 - bias),
                             (1.0 + fraction) * 2.0 ** (exponent - bias))
    if fmt == "fp8_e4m3":
        values[[0x7F, 0xFF]] = np.nan  # e4m3fn: no infinities, one NaN per sign
    else:
        values[exponent == 31] = np.nan  # e5m2: infinities and NaNs
    return values


def quantize(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [..., D] -> (values float64 [..., D] of the chosen codes, scale
    float32 [...]): scale = max|x| / largest code, codes nearest to x / scale."""
    x = np.asarray(x, dtype=np.float32)
    scale = (np.abs(x).max(axis=-1) / np.float32(LARGEST[fmt])).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[..., None]
    v = np.where(scale[..., None] > 0, x / safe, np.float32(0)).astype(np.float64)
    values = code_values(fmt)
    finite = np.flatnonzero(np.isfinite(values))
    candidates = values[finite]
    distance = np.abs(v[..., None] - candidates)
    best = distance.min(axis=-1, keepdims=True)
    tied = distance == best
    even = tied & (finite % 2 == 0)
    pick = np.where(even.any(axis=-1), even.argmax(axis=-1), tied.argmax(axis=-1))
    return candidates[pick], scale


def decoded_rows(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 [..., D]: the rows a quantized cache reads back (code value x scale)."""
    values, scales = quantize(x, fmt)
    return values * scales[..., None].astype(np.float64)


def read_cache(cache: np.ndarray, head_dim: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 cache [..., head_dim + 4] -> (code values float64 [..., head_dim],
    scales float32 [...])."""
    values = code_values(fmt)[cache[..., :head_dim]]
    scales = np.ascontiguousarray(cache[..., head_dim:]).view(np.float32)[..., 0]
    return values, scales
