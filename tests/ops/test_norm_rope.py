"""rms_norm and rope against numpy float64 oracles and MLX's own mx.fast functions."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from vllm_metal.ops.norm_rope import rms_norm, rope

FLOATS = (mx.float32, mx.bfloat16, mx.float16)
TOL = {mx.float32: 2e-6, mx.bfloat16: 1.6e-2, mx.float16: 2e-3}


def rand(shape, dtype=mx.float32, seed=0):
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)


def f64(a):
    return np.array(a.astype(mx.float32)).astype(np.float64)


def rms_norm_np(x, w, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope_np(x, dims, traditional, base, scale, offsets, freqs=None):
    """x [B, M, L, D] float64; offsets [B]."""
    half = dims // 2
    inv = 1.0 / freqs if freqs is not None else base ** (-2.0 * np.arange(half) / dims)
    pos = offsets[:, None] + np.arange(x.shape[-2])[None, :]               # [B, L]
    theta = (pos * scale)[:, None, :, None] * inv                          # [B, 1, L, half]
    c, s = np.cos(theta), np.sin(theta)
    out = x.copy()
    if traditional:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2] = x1 * c - x2 * s
        out[..., 1:dims:2] = x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half], x[..., half:dims]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:dims] = x1 * s + x2 * c
    return out


@pytest.mark.parametrize("w_dtype", FLOATS + (None,))
@pytest.mark.parametrize("x_dtype", FLOATS)
def test_rms_norm_dtypes(x_dtype, w_dtype):
    x = rand((3, 5, 96), x_dtype, seed=1)
    w = None if w_dtype is None else rand((96,), w_dtype, seed=2)
    out = rms_norm(x, w, 1e-5)
    want_dtype = x_dtype if w is None else (mx.zeros(1, x_dtype) * mx.zeros(1, w_dtype)).dtype
    assert out.dtype == want_dtype == mx.fast.rms_norm(x, w, 1e-5).dtype
    ref = rms_norm_np(f64(x), None if w is None else f64(w), 1e-5)
    tol = max(TOL[x_dtype], TOL[want_dtype])
    np.testing.assert_allclose(f64(out), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("rows", [1, 7, 300])   # 300 x 576 takes the thread pool
def test_rms_norm_rows_and_strided_input(rows):
    x = rand((576, rows), seed=3).T           # a transposed view: not row-contiguous
    w = rand((576,), seed=4)
    np.testing.assert_allclose(f64(rms_norm(x, w, 1e-6)), rms_norm_np(f64(x), f64(w), 1e-6),
                               rtol=1e-5, atol=1e-5)


def test_rms_norm_rejects_bad_arguments():
    x = rand((2, 8))
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, rand((7,)), 1e-5)
    with pytest.raises(TypeError, match="x must be"):
        rms_norm(mx.zeros((2, 8), dtype=mx.int32), None, 1e-5)
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, None, -1.0)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [64, 32])   # 32 < D: the tail passes through
def test_rope_base_against_float64(traditional, dims):
    x = rand((4, 3, 5, 64), seed=5)
    offsets = np.array([0, 17, 4000, 131071])
    out = rope(x, dims, traditional=traditional, base=10000.0, scale=0.25,
               offset=mx.array(offsets, dtype=mx.int32))
    ref = rope_np(f64(x), dims, traditional, 10000.0, 0.25, offsets)
    # The angle is formed in double: even position 131071 is exact to float rounding.
    np.testing.assert_allclose(f64(out), ref, rtol=1e-5, atol=2e-6)


def test_rope_freqs_and_scalar_offset():
    x = rand((2, 4, 6, 32), seed=6)
    freqs = mx.array(np.geomspace(1.0, 5e4, 16).astype(np.float32))
    out = rope(x, 32, traditional=False, base=None, scale=1.0, offset=9, freqs=freqs)
    ref = rope_np(f64(x), 32, False, None, 1.0, np.array([9, 9]), freqs=f64(freqs))
    np.testing.assert_allclose(f64(out), ref, rtol=1e-5, atol=2e-6)
    mlx = mx.fast.rope(x, 32, traditional=False, base=None, scale=1.0, offset=9, freqs=freqs)
    np.testing.assert_allclose(f64(out), f64(mlx), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_dtypes_match_mlx(dtype):
    x = rand((3, 2, 4, 16), dtype, seed=7)
    off = mx.array([1, 2, 3], dtype=mx.int32)
    out = rope(x, 16, traditional=False, base=500.0, scale=1.0, offset=off)
    want = mx.fast.rope(x, 16, traditional=False, base=500.0, scale=1.0, offset=off)
    assert out.dtype == dtype
    np.testing.assert_allclose(f64(out), f64(want), rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)


def test_rope_large_prefill_uses_pool_and_matches():
    x = rand((1, 9, 700, 64), seed=8)      # 700 rows x 576: split over the thread pool
    out = rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=3)
    ref = rope_np(f64(x), 64, False, 10000.0, 1.0, np.array([3]))
    np.testing.assert_allclose(f64(out), ref, rtol=1e-5, atol=2e-6)


def test_rope_rejects_bad_arguments():
    x = rand((2, 1, 3, 8))
    with pytest.raises(ValueError, match="dims"):
        rope(x, 7, traditional=False, base=1e4, scale=1.0, offset=0)
    with pytest.raises(ValueError, match="exactly one"):
        rope(x, 8, traditional=False, base=None, scale=1.0, offset=0)
    with pytest.raises(ValueError, match="offset"):
        rope(x, 8, traditional=False, base=1e4, scale=1.0, offset=mx.array([1, 2, 3]))
    with pytest.raises(ValueError, match="3-D"):
        rope(rand((3, 8)), 8, traditional=False, base=1e4, scale=1.0, offset=0)
