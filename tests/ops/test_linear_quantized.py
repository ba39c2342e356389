"""quantized_matmul against a numpy float64 oracle and MLX's own quantized
matmul, one test per edge case."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import (
    FLOATS, as_f64, assert_matmul_close, cpu_isa, make_quantized, random_float)
from vllm_metal.ops import linear
from vllm_metal.ops.reference import quantized_matmul_ref


def run(x, q, bias=None):
    return linear.quantized_matmul(x, *q.args(), bits=q.bits, group_size=q.group_size, bias=bias)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 37])
def test_every_bit_width_group_size_and_row_count(bits, group_size, m):
    # N = 45 is no multiple of any tile; M = 9 and 37 take the tiled GEMM path
    # with a partial row strip; K = 3 groups is no multiple of 64 for gs 32.
    q = make_quantized(45, 3 * group_size, bits, group_size, seed=m)
    x = random_float((m, 3 * group_size), seed=m + 1)
    assert_matmul_close(run(x, q), x, q.dequantized())


@pytest.mark.parametrize("m", [1, 6, 20])
def test_agrees_with_mx_quantized_matmul(m):
    q = make_quantized(70, 256, 4, 64)
    x = random_float((m, 256), seed=3)
    expected = np.array(quantized_matmul_ref(x, *q.args(), bits=4, group_size=64))
    np.testing.assert_allclose(np.array(run(x, q)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("scale_dtype", FLOATS)
@pytest.mark.parametrize("m", [1, 12])
def test_activation_and_scale_dtypes(dtype, scale_dtype, m):
    # The output dtype follows MLX's promotion (x's dtype when they agree).
    q = make_quantized(33, 128, 4, 32, scale_dtype=scale_dtype)
    x = random_float((m, 128), dtype=dtype, seed=4)
    assert_matmul_close(run(x, q), x, q.dequantized(), w_dtype=scale_dtype)


@pytest.mark.parametrize("scale_dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [2, 11])
def test_half_precision_scales_and_biases(scale_dtype, bits, m):
    q = make_quantized(40, 192, bits, 64, scale_dtype=scale_dtype)
    x = random_float((m, 192), dtype=scale_dtype, seed=5)
    assert_matmul_close(run(x, q), x, q.dequantized(), w_dtype=scale_dtype)


@pytest.mark.parametrize("m", [1, 10])
@pytest.mark.parametrize("bias_dtype", [mx.float32, mx.bfloat16])
def test_bias_is_added_to_every_row(m, bias_dtype):
    q = make_quantized(24, 64, 8, 32)
    x = random_float((m, 64), seed=6)
    bias = random_float((24,), dtype=bias_dtype, seed=7, scale=10.0)
    assert_matmul_close(run(x, q, bias), x, q.dequantized(), bias)


def test_bias_with_bfloat16_output():
    q = make_quantized(24, 64, 4, 64, scale_dtype=mx.bfloat16)
    x = random_float((3, 64), dtype=mx.bfloat16, seed=8)
    bias = random_float((24,), dtype=mx.bfloat16, seed=9)
    out = run(x, q, bias)
    assert out.dtype == mx.bfloat16
    assert_matmul_close(out, x, q.dequantized(), bias, w_dtype=mx.bfloat16)


def test_leading_dimensions_are_kept():
    q = make_quantized(20, 64, 4, 32)
    x = random_float((2, 3, 64), seed=10)
    out = run(x, q)
    assert out.shape == (2, 3, 20)
    assert_matmul_close(out, x, q.dequantized())


@pytest.mark.parametrize("m", [2, 16])
def test_strided_activations(m):
    # A transposed view: eval copies it to rows first.
    q = make_quantized(30, 96, 4, 32)
    xt = random_float((96, m), seed=11)
    x = xt.T
    assert_matmul_close(run(x, q), x, q.dequantized())


def test_single_output_column():
    q = make_quantized(1, 64, 4, 64)
    x = random_float((5, 64), seed=12)
    assert_matmul_close(run(x, q), x, q.dequantized())


def test_zero_rows():
    q = make_quantized(8, 32, 4, 32)
    out = run(mx.zeros((0, 32)), q)
    mx.eval(out)
    assert out.shape == (0, 8)


@pytest.mark.parametrize("m", [1, 3, 24])
def test_split_across_threads(m):
    # Large enough (N * K / 2 bytes > 128 KiB) for the pool to split the columns.
    q = make_quantized(1100, 512, 4, 32, seed=13)
    x = random_float((m, 512), seed=14)
    assert_matmul_close(run(x, q), x, q.dequantized())


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 4, 13])
def test_every_cpu_isa_variant(isa, bits, m):
    q = make_quantized(37, 128, bits, 32, scale_dtype=mx.bfloat16, seed=15)
    x = random_float((m, 128), seed=16)
    bias = random_float((37,), seed=17)
    with cpu_isa(isa):
        out = run(x, q, bias)
        mx.eval(out)
    assert_matmul_close(out, x, q.dequantized(), bias, w_dtype=mx.bfloat16)


def test_output_is_lazy_and_composes_with_mlx_ops():
    q = make_quantized(16, 64, 4, 32)
    x = random_float((2, 64), seed=18)
    y = mx.maximum(run(x, q), 0.0).sum()  # no eval in between
    expected = np.maximum(as_f64(x) @ q.dequantized().T, 0).sum()
    assert abs(y.item() - expected) < 1e-4 * max(1.0, abs(expected))
