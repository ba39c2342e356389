"""embedding_gather against numpy indexing of the (oracle-dequantized) table."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import FLOATS, as_f64, make_quantized, random_float
from vllm_metal.ops import linear
from vllm_metal.ops.reference import embedding_gather_ref


@pytest.mark.parametrize("dtype", FLOATS)
def test_dense_rows_are_copied_exactly(dtype):
    table = random_float((50, 24), dtype=dtype)
    ids = mx.array([3, 0, 49, 3, 17], dtype=mx.int32)
    out = linear.embedding_gather(ids, table)
    assert out.dtype == dtype and out.shape == (5, 24)
    np.testing.assert_array_equal(as_f64(out), as_f64(table)[np.array(ids)])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", FLOATS)
def test_quantized_rows_are_dequantized(bits, group_size, scale_dtype):
    q = make_quantized(40, 2 * group_size, bits, group_size, scale_dtype=scale_dtype)
    ids = mx.array([[39, 0, 7], [7, 12, 1]], dtype=mx.int32)
    out = linear.embedding_gather(ids, *q.args(), bits=bits, group_size=group_size)
    assert out.dtype == scale_dtype and out.shape == (2, 3, 2 * group_size)
    expected = q.dequantized()[np.array(ids)]
    tol = 1e-6 if scale_dtype == mx.float32 else 2.0**-7
    np.testing.assert_allclose(as_f64(out), expected, rtol=tol, atol=tol * np.abs(expected).max())
    # MLX dequantizes in the scales' dtype, rounding twice: allow a few units.
    reference = embedding_gather_ref(ids, *q.args(), bits=bits, group_size=group_size)
    np.testing.assert_allclose(as_f64(out), as_f64(reference), rtol=0,
                               atol=4 * tol * np.abs(expected).max())


@pytest.mark.parametrize("dtype", [mx.int64, mx.uint32, mx.int16])
def test_any_integer_id_dtype(dtype):
    table = random_float((10, 8))
    ids = mx.array([9, 2, 2], dtype=dtype)
    np.testing.assert_array_equal(np.array(linear.embedding_gather(ids, table)),
                                  np.array(table)[[9, 2, 2]])


def test_many_rows_split_across_threads():
    q = make_quantized(300, 64, 4, 32)
    ids = mx.array(np.random.default_rng(0).integers(0, 300, size=700).astype(np.int32))
    out = linear.embedding_gather(ids, *q.args(), bits=4, group_size=32)
    np.testing.assert_allclose(as_f64(out), q.dequantized()[np.array(ids)], rtol=1e-6, atol=1e-6)


def test_no_ids():
    out = linear.embedding_gather(mx.zeros((0,), dtype=mx.int32), random_float((4, 8)))
    mx.eval(out)
    assert out.shape == (0, 8)


@pytest.mark.parametrize("bad", [50, -1])
def test_id_outside_the_table_raises_at_eval(bad):
    table = random_float((50, 8))
    out = linear.embedding_gather(mx.array([1, bad], dtype=mx.int32), table)
    with pytest.raises(RuntimeError, match=f"ids\\[1\\] = {bad} is outside the table's 50 rows"):
        mx.eval(out)


def test_quantized_id_outside_the_table_raises_at_eval():
    q = make_quantized(6, 32, 4, 32)
    out = linear.embedding_gather(mx.array([6], dtype=mx.int32), *q.args(), bits=4,
                                  group_size=32)
    with pytest.raises(RuntimeError, match="outside the table's 6 rows"):
        mx.eval(out)
