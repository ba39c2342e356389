"""quantized_matmul with int8_activations against a numpy float64 oracle of the
int8 scheme (csrc/cpu/linear/linear_q8.h), and against fp32 within the rounding bound.

The oracle quantizes x itself (float32 arithmetic, as the kernels: step
max|x| / 127, q = round-half-even(x * (127 / max|x|)) per 32 columns), then
computes every product in float64, so it checks the kernels' layouts, integer
dot products and scaling, not their rounding choices.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import (
    FLOATS, as_f64, cpu_isa, make_quantized, promoted, random_float)
from vllm_metal.ops import linear

BLOCK = 32


def run(x, q, bias=None):
    return linear.quantized_matmul(x, *q.args(), bits=q.bits, group_size=q.group_size,
                                   bias=bias, int8_activations=True)


def quantize_rows(x: mx.array) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] -> (q int [M, K], step float64 [M, K]) per 32-column block."""
    x32 = np.array(x.astype(mx.float32), dtype=np.float32)
    m, k = x32.shape
    blocks = x32.reshape(m, k // BLOCK, BLOCK)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    inv = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    q = np.rint((blocks * inv).astype(np.float32)).astype(np.int64)
    step = np.broadcast_to(amax / np.float32(127), blocks.shape).astype(np.float64)
    return q.reshape(m, k), step.reshape(m, k)


def oracle(x: mx.array, q, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """(y, bound): y = the int8 scheme in float64; bound = |y - x @ W.T| limit.

    W = s * code + b: the codes meet the rounded x (q * step), the biases the
    exact x (their share of the sum is computed from fp32 x). Each rounded
    element is within step / 2 of x, so |y - x @ W.T| <= |s * code| . step / 2.
    """
    x2 = x.reshape(-1, x.shape[-1])
    xq, step = quantize_rows(x2)
    s = np.repeat(as_f64(q.scales), q.group_size, axis=1)
    b = np.repeat(as_f64(q.biases), q.group_size, axis=1)
    codes = (q.dequantized() - b) / np.where(s == 0, 1, s)
    codes = np.rint(codes)
    x64 = as_f64(x2)
    y = (xq * step) @ (s * codes).T + x64 @ b.T
    bound = step / 2 @ np.abs(s * codes).T
    if bias is not None:
        y = y + as_f64(bias)
    return y, bound


def assert_q8_close(out: mx.array, x: mx.array, q, bias=None, out_eps=1e-5):
    y, _ = oracle(x, q, bias)
    got = as_f64(out).reshape(y.shape)
    assert np.isfinite(got).all()
    magnitude = np.abs(as_f64(x.reshape(-1, x.shape[-1]))) @ np.abs(q.dequantized()).T
    tol = out_eps * (magnitude + np.abs(y)) + 1e-30
    bad = np.abs(got - y) > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst {np.abs(got - y).max():.3g}"


@pytest.mark.parametrize("isa", ["avx512", "generic"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 9, 16, 37])
def test_every_layout_and_row_count_matches_the_oracle(isa, bits, group_size, m):
    # K = 5 groups: for 4 bits no multiple of the 128-column chunk (a masked
    # tail); N = 45 leaves a partial 16-column GEMM tile; M <= 4 reads W in its
    # own layout (GEMV), M > 4 repacks it (GEMM, with a partial row strip).
    k = 5 * group_size
    q = make_quantized(45, k, bits, group_size, seed=m)
    x = random_float((m, k), seed=m + 1)
    with cpu_isa(isa):
        assert_q8_close(run(x, q), x, q)


@pytest.mark.parametrize("k", [32, 96, 160, 576, 1536])
@pytest.mark.parametrize("m", [1, 12])
def test_widths_off_the_chunk_grid(k, m):
    q = make_quantized(33, k, 4, 32, seed=k)
    x = random_float((m, k), seed=k + m)
    assert_q8_close(run(x, q), x, q)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_rows_longer_than_one_scale_window(bits, group_size, m):
    # The GEMV applies scales a window of 512 columns at a time: K = 1664 is
    # three full windows and a partial one for every group size; N = 47 is
    # odd, so every row count ends in single-row tiles.
    k = 1664
    q = make_quantized(47, k, bits, group_size, seed=group_size + m)
    x = random_float((m, k), seed=bits + m)
    assert_q8_close(run(x, q), x, q)


@pytest.mark.parametrize("scale_dtype", FLOATS)
@pytest.mark.parametrize("x_dtype", FLOATS)
def test_input_and_scale_dtypes(x_dtype, scale_dtype):
    q = make_quantized(40, 256, 4, 64, scale_dtype=scale_dtype)
    x = random_float((3, 256), x_dtype, seed=2)
    bias = random_float((40,), seed=5)
    out = run(x, q, bias)
    assert out.dtype == promoted(x_dtype, scale_dtype, mx.float32)
    eps = {mx.float32: 1e-5, mx.bfloat16: 2.0**-8, mx.float16: 2.0**-10}[out.dtype]
    assert_q8_close(out, x, q, bias, out_eps=eps)


@pytest.mark.parametrize("m", [2, 20])
def test_zero_blocks_and_outliers(m):
    # An all-zero block has step 0 (no division by zero); a block with one
    # large value keeps the rest at coarse steps, still within the bound.
    q = make_quantized(24, 128, 4, 32)
    x = np.array(random_float((m, 128), seed=7))
    x[:, :32] = 0.0
    x[:, 40] = 1000.0
    x = mx.array(x)
    assert_q8_close(run(x, q), x, q)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 9])
def test_within_the_rounding_bound_of_fp32(bits, m):
    q = make_quantized(64, 512, bits, 32, seed=bits)
    x = random_float((m, 512), seed=11)
    exact = as_f64(x) @ q.dequantized().T
    _, bound = oracle(x, q)
    got = as_f64(run(x, q))
    assert (np.abs(got - exact) <= bound * 1.0001 + 1e-4).all()
    # and the rounding is not free: the int8 result is not the fp32 one
    fp32 = as_f64(linear.quantized_matmul(x, *q.args(), bits=bits, group_size=32))
    assert np.abs(got - fp32).max() > 1e-5


def test_leading_dims_and_isa_agreement():
    q = make_quantized(50, 192, 4, 64)
    x = random_float((2, 3, 192), seed=4)
    out = run(x, q)
    assert out.shape == (2, 3, 50)
    with cpu_isa("generic"):
        portable = run(x, q)
    np.testing.assert_allclose(np.array(out), np.array(portable), rtol=1e-5, atol=1e-5)


def symmetric(q):
    """q with GGUF Q8_0/Q4_0 biases: -2^(bits-1) * scale (W = scale * (code - zero point))."""
    zero = 2 ** (q.bits - 1)
    return replace(q, biases=q.scales * -zero), zero


@pytest.mark.parametrize("isa", ["avx512", "generic"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 13])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.float32])
def test_symmetric_weights_without_biases(isa, bits, m, scale_dtype):
    # biases=None: each bias is -zero_point * scale, formed from the scale the
    # kernel already holds. The GEMV (M <= 4) and the GEMM's repacked tiles
    # (M > 4) must give exactly what the same biases read from memory give,
    # and both match the oracle. K = 1664 spans several scale windows; N = 45
    # ends in a partial tile.
    q, zero = symmetric(make_quantized(45, 1664, bits, 32, scale_dtype=scale_dtype, seed=m))
    x = random_float((m, 1664), seed=m + 7)
    with cpu_isa(isa):
        read = run(x, q)
        formed = linear.quantized_matmul(x, q.w, q.scales, None, bits=bits, group_size=32,
                                         int8_activations=True, zero_point=zero)
        mx.eval(read, formed)   # the ops are lazy: run them under this ISA
    assert_q8_close(formed, x, q)
    np.testing.assert_array_equal(np.array(formed), np.array(read))


def test_symmetric_zero_point_changes_the_result():
    # The zero point is used, not assumed: a wrong one moves every output.
    q, zero = symmetric(make_quantized(16, 128, 8, 32, seed=3))
    x = random_float((1, 128), seed=4)
    right = linear.quantized_matmul(x, q.w, q.scales, None, bits=8, group_size=32,
                                    int8_activations=True, zero_point=zero)
    wrong = linear.quantized_matmul(x, q.w, q.scales, None, bits=8, group_size=32,
                                    int8_activations=True, zero_point=zero - 1)
    assert_q8_close(right, x, q)
    assert (np.abs(np.array(right) - np.array(wrong)) > 1e-6).all()


def test_symmetric_arguments_are_checked():
    q = make_quantized(8, 64, 8, 32)
    x = random_float((1, 64))
    with pytest.raises(ValueError, match="int8_activations=True"):
        linear.quantized_matmul(x, q.w, q.scales, None, bits=8, group_size=32, zero_point=128)
    with pytest.raises(ValueError, match="only with biases=None"):
        linear.quantized_matmul(x, *q.args(), bits=8, group_size=32, int8_activations=True,
                                zero_point=128)
    for bad in (float("nan"), "128", True):
        with pytest.raises(TypeError, match="zero_point"):
            linear.quantized_matmul(x, q.w, q.scales, None, bits=8, group_size=32,
                                    int8_activations=True, zero_point=bad)


def test_flag_must_be_a_bool():
    q = make_quantized(8, 64, 4, 32)
    with pytest.raises(TypeError, match="int8_activations"):
        linear.quantized_matmul(random_float((1, 64)), *q.args(), bits=4, group_size=32,
                                int8_activations="yes")
