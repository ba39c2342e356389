"""dense_matmul against a numpy float64 oracle and MLX's matmul, one test per
edge case."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import FLOATS, as_f64, assert_matmul_close, cpu_isa, random_float
from vllm_metal.ops import linear
from vllm_metal.ops.reference import dense_matmul_ref


@pytest.mark.parametrize("k", [1, 7, 16, 33, 100])
@pytest.mark.parametrize("m", [1, 4, 5, 9, 40])
def test_any_inner_size_and_row_count(k, m):
    # K not a multiple of the SIMD width takes the masked tail; M > 8 the GEMM.
    x = random_float((m, k), seed=k)
    w = random_float((29, k), seed=m)
    assert_matmul_close(linear.dense_matmul(x, w), x, as_f64(w))


@pytest.mark.parametrize("w_dtype", FLOATS)
@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("m", [1, 17])
def test_weight_and_activation_dtypes(w_dtype, x_dtype, m):
    # The output dtype follows MLX's promotion (x's dtype when they agree).
    x = random_float((m, 70), dtype=x_dtype, seed=1)
    w = random_float((21, 70), dtype=w_dtype, seed=2)
    assert_matmul_close(linear.dense_matmul(x, w), x, as_f64(w), w_dtype=w_dtype)


@pytest.mark.parametrize("m", [2, 12])
def test_agrees_with_mlx_matmul(m):
    x = random_float((m, 48), seed=3)
    w = random_float((50, 48), dtype=mx.bfloat16, seed=4)
    np.testing.assert_allclose(np.array(linear.dense_matmul(x, w)),
                               np.array(dense_matmul_ref(x, w)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [1, 10])
def test_bias_is_added_to_every_row(m):
    x = random_float((m, 40), seed=5)
    w = random_float((12, 40), seed=6)
    bias = random_float((12,), dtype=mx.float16, seed=7, scale=5.0)
    assert_matmul_close(linear.dense_matmul(x, w, bias), x, as_f64(w), bias)


def test_half_precision_everywhere_stays_half():
    x = random_float((3, 40), dtype=mx.float16, seed=5)
    w = random_float((12, 40), dtype=mx.float16, seed=6)
    bias = random_float((12,), dtype=mx.float16, seed=7)
    out = linear.dense_matmul(x, w, bias)
    assert out.dtype == mx.float16
    assert_matmul_close(out, x, as_f64(w), bias, w_dtype=mx.float16)


def test_leading_dimensions_and_strided_weight():
    x = random_float((2, 5, 24), seed=8)
    w = random_float((24, 31), seed=9).T  # a transposed view [31, 24]
    out = linear.dense_matmul(x, w)
    assert out.shape == (2, 5, 31)
    assert_matmul_close(out, x, as_f64(w))


def test_empty_inner_dimension_gives_the_bias():
    x = mx.zeros((3, 0))
    w = mx.zeros((4, 0))
    bias = mx.array([1.0, -2.0, 3.0, 0.5])
    out = linear.dense_matmul(x, w, bias)
    np.testing.assert_array_equal(np.array(out), np.tile(np.array(bias), (3, 1)))


@pytest.mark.parametrize("m", [1, 3, 20])
@pytest.mark.parametrize("w_dtype", [mx.float32, mx.bfloat16])
def test_split_across_threads(m, w_dtype):
    x = random_float((m, 300), seed=10)
    w = random_float((700, 300), dtype=w_dtype, seed=11)
    assert_matmul_close(linear.dense_matmul(x, w), x, as_f64(w), w_dtype=w_dtype)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("w_dtype", FLOATS)
@pytest.mark.parametrize("m", [1, 3, 11])
def test_every_cpu_isa_variant(isa, w_dtype, m):
    x = random_float((m, 37), seed=12)
    w = random_float((19, 37), dtype=w_dtype, seed=13)
    with cpu_isa(isa):
        out = linear.dense_matmul(x, w)
        mx.eval(out)
    assert_matmul_close(out, x, as_f64(w), w_dtype=w_dtype)
