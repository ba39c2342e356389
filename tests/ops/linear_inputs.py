"""Inputs and a numpy float64 oracle for the linear-op tests.

The oracle unpacks MLX's affine layout itself (codes ``bits`` wide, lowest bits
first in each uint32; W = scale * q + bias per group), so it does not rely on
``mx.dequantize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from tests.ops.isa import cpu_isa  # noqa: F401  (re-exported for the linear tests)

FLOATS = (mx.float32, mx.bfloat16, mx.float16)
# Relative error of one rounding to the output dtype (fp32 also covers the
# difference between summation orders).
OUTPUT_EPS = {mx.float32: 1e-5, mx.bfloat16: 2.0**-8, mx.float16: 2.0**-10}


def as_f64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def random_float(shape, dtype=mx.float32, seed=0, scale=1.0) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array((scale * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


@dataclass
class Quantized:
    w: mx.array       # uint32 [N, K * bits / 32]
    scales: mx.array  # [N, K / group_size]
    biases: mx.array
    bits: int
    group_size: int

    def dequantized(self) -> np.ndarray:
        """float64 [N, K] from the packed codes (independent of mx.dequantize)."""
        words = np.array(self.w, dtype=np.uint64)
        per_word = 32 // self.bits
        shifts = np.arange(per_word, dtype=np.uint64) * self.bits
        codes = (words[:, :, None] >> shifts) & np.uint64((1 << self.bits) - 1)
        q = codes.reshape(words.shape[0], -1).astype(np.float64)
        s = np.repeat(as_f64(self.scales), self.group_size, axis=1)
        b = np.repeat(as_f64(self.biases), self.group_size, axis=1)
        return s * q + b

    def args(self):
        return self.w, self.scales, self.biases


def make_quantized(n: int, k: int, bits: int, group_size: int, scale_dtype=mx.float32,
                   seed=0) -> Quantized:
    w, scales, biases = mx.quantize(random_float((n, k), seed=seed), group_size=group_size,
                                    bits=bits)
    return Quantized(w, scales.astype(scale_dtype), biases.astype(scale_dtype), bits, group_size)


def promoted(*dtypes: mx.Dtype) -> mx.Dtype:
    """MLX's type promotion of float dtypes (what x @ w.T + bias returns)."""
    out = mx.zeros((1,), dtype=dtypes[0])
    for d in dtypes[1:]:
        out = out + mx.zeros((1,), dtype=d)
    return out.dtype


def assert_matmul_close(out: mx.array, x: mx.array, w64: np.ndarray, bias=None,
                        w_dtype: mx.Dtype = mx.float32) -> None:
    """out ~ x @ w64.T (+ bias), within the output dtype's rounding of each row's scale.

    w_dtype is the weights' (or the scales') dtype: the output is MLX's promotion
    of it with x's (and the bias') dtype.
    """
    x64 = as_f64(x).reshape(-1, x.shape[-1])
    expected = x64 @ w64.T
    if bias is not None:
        expected = expected + as_f64(bias)
    out_dtype = promoted(x.dtype, w_dtype, *(() if bias is None else (bias.dtype,)))
    assert out.dtype == out_dtype
    assert out.shape == (*x.shape[:-1], w64.shape[0])
    got = as_f64(out).reshape(expected.shape)
    assert np.isfinite(got).all()
    # Scale of each entry: |x| . |w| bounds the sum whatever the order.
    magnitude = np.abs(x64) @ np.abs(w64).T + (0 if bias is None else np.abs(as_f64(bias)))
    tol = OUTPUT_EPS[out_dtype] * (magnitude + np.abs(expected)) + 1e-30
    bad = np.abs(got - expected) > tol
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} entries off; worst {np.abs(got - expected).max():.3g}")
