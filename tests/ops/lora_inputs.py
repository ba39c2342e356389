"""Inputs and a numpy float64 oracle for the LoRA op tests (CPU op and Metal kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

FLOATS = (mx.float32, mx.bfloat16, mx.float16)
# Relative error of one rounding to the output dtype (fp32 also covers the
# difference between summation orders).
OUTPUT_EPS = {mx.float32: 1e-5, mx.bfloat16: 2.0**-8, mx.float16: 2.0**-10}


def as_f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


@dataclass
class Adapters:
    lora_a: mx.array  # [L, r, in]
    lora_b: mx.array  # [L, r, out]
    scale: mx.array   # float32 [L]

    def args(self):
        return self.lora_a, self.lora_b, self.scale


def make_adapters(slots: int, rank: int, k: int, n: int, dtype=mx.float32, seed=0) -> Adapters:
    """Random stacks; slot s has rank r_s <= rank (rows and columns past it zero, as
    the runner pads), so mixed ranks share one tensor."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((slots, rank, k)).astype(np.float32) / np.sqrt(max(k, 1))
    b = rng.standard_normal((slots, rank, n)).astype(np.float32)
    for s in range(slots):
        used = max(1, rank - s * rank // 4)  # slot 0 full rank, later slots smaller
        a[s, used:] = 0
        b[s, used:] = 0
    scale = (2.0 ** rng.integers(-2, 3, slots)).astype(np.float32)
    return Adapters(mx.array(a).astype(dtype), mx.array(b).astype(dtype), mx.array(scale))


def random_float(shape, dtype=mx.float32, seed=0) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def mixed_idx(rows: int, slots: int, seed=0) -> mx.array:
    """Each row's slot in [-1, slots): every slot, then -1, present when rows allow
    (one row: slot 0), the rest random, in random order."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-1, slots, rows)
    first = [*range(slots), -1][:rows]
    values[: len(first)] = first
    rng.shuffle(values)
    return mx.array(values.astype(np.int32))


def delta64(x: mx.array, idx: mx.array, ad: Adapters) -> tuple[np.ndarray, np.ndarray]:
    """(update, magnitude) [T, out] in float64: scale * (A @ x) @ B per row and
    |scale| * (|A| @ |x|) @ |B|, which bounds the sum whatever its order."""
    x64 = as_f64(x).reshape(-1, x.shape[-1])
    a64, b64, s64 = as_f64(ad.lora_a), as_f64(ad.lora_b), as_f64(ad.scale)
    out = np.zeros((x64.shape[0], b64.shape[2]))
    mag = np.zeros_like(out)
    for t, slot in enumerate(np.array(idx).tolist()):
        if slot >= 0:
            out[t] = s64[slot] * ((a64[slot] @ x64[t]) @ b64[slot])
            mag[t] = abs(s64[slot]) * ((np.abs(a64[slot]) @ np.abs(x64[t])) @ np.abs(b64[slot]))
    return out, mag


def assert_close(got: mx.array | np.ndarray, expected: np.ndarray, magnitude: np.ndarray,
                 dtype: mx.Dtype) -> None:
    """got ~ expected within the output dtype's rounding of each entry's scale."""
    got64 = as_f64(got) if isinstance(got, mx.array) else got.astype(np.float64)
    got64 = got64.reshape(expected.shape)
    assert np.isfinite(got64).all()
    tol = OUTPUT_EPS[dtype] * (magnitude + np.abs(expected)) + 1e-30
    bad = np.abs(got64 - expected) > tol
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} entries off; worst {np.abs(got64 - expected).max():.3g}")


def bits(a: mx.array) -> bytes:
    """The array's bytes (bfloat16 compared as its bit patterns)."""
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a).tobytes()
