"""Bad arguments to the linear ops raise ValueError/TypeError naming the argument."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.ops.linear_inputs import make_quantized
from vllm_metal.ops import linear

Q = make_quantized(8, 64, 4, 32)
X = mx.zeros((2, 64))


def quantized(**changes):
    args = dict(x=X, w=Q.w, scales=Q.scales, biases=Q.biases, bits=4, group_size=32)
    args.update(changes)
    return linear.quantized_matmul(**args)


QUANTIZED_CASES = [
    (dict(x=[[0.0] * 64]), TypeError, "x must be an mx.array"),
    (dict(x=mx.zeros((2, 64), dtype=mx.int32)), TypeError, "x must be float32"),
    (dict(x=mx.array(1.0)), ValueError, "x must be at least 1-D"),
    (dict(x=mx.zeros((2, 96))), ValueError, "does not match x's K = 96"),
    (dict(w=Q.w.astype(mx.int32)), TypeError, "w must be a 2-D uint32"),
    (dict(w=Q.w[0]), TypeError, "w must be a 2-D uint32"),
    (dict(bits=3), ValueError, "bits must be one of \\(4, 8\\)"),
    (dict(bits=4.0), TypeError, "bits must be an int"),
    (dict(bits=8), ValueError, "does not match x's K = 64 at bits=8"),
    (dict(group_size=16), ValueError, "group_size must be one of"),
    (dict(group_size=True), TypeError, "group_size must be an int"),
    (dict(group_size=64), ValueError, "scales must be \\[N, K / group_size\\] = \\(8, 1\\)"),
    (dict(scales=Q.scales[:4]), ValueError, "scales must be \\[N, K / group_size\\]"),
    (dict(scales=Q.scales.astype(mx.int32)), TypeError, "scales must be float32"),
    (dict(biases=Q.biases.astype(mx.float16)), TypeError, "biases dtype"),
    (dict(biases=Q.biases[:, :1]), ValueError, "biases must be \\[N, K / group_size\\]"),
    (dict(bias=mx.zeros((7,))), ValueError, "bias must be \\[N\\] = \\(8,\\)"),
    (dict(bias=mx.zeros((8,), dtype=mx.int32)), TypeError, "bias must be float32"),
]


@pytest.mark.parametrize("change,error,message", QUANTIZED_CASES)
def test_quantized_matmul_rejects(change, error, message):
    with pytest.raises(error, match=message):
        quantized(**change)


@pytest.mark.parametrize("change,error,message", [
    (dict(x=mx.zeros((2, 5))), ValueError, "w must be \\[N, K\\] with x's K = 5"),
    (dict(w=mx.zeros((4, 8, 1))), ValueError, "w must be \\[N, K\\]"),
    (dict(w=mx.zeros((4, 8), dtype=mx.uint32)), TypeError, "w must be float32"),
    (dict(x=mx.zeros((2, 8), dtype=mx.bool_)), TypeError, "x must be float32"),
    (dict(bias=mx.zeros((5,))), ValueError, "bias must be \\[N\\] = \\(4,\\)"),
    (dict(bias=[0.0] * 4), TypeError, "bias must be an mx.array"),
])
def test_dense_matmul_rejects(change, error, message):
    args = dict(x=mx.zeros((2, 8)), w=mx.zeros((4, 8)))
    args.update(change)
    with pytest.raises(error, match=message):
        linear.dense_matmul(**args)


@pytest.mark.parametrize("args,kwargs,error,message", [
    ((mx.zeros((2,)), mx.zeros((4, 8))), {}, TypeError, "ids must be an integer array"),
    (([1, 2], mx.zeros((4, 8))), {}, TypeError, "ids must be an mx.array"),
    ((mx.array([1]), mx.zeros((4,))), {}, ValueError, "table must be 2-D"),
    ((mx.array([1]), mx.zeros((4, 8), dtype=mx.int32)), {}, TypeError,
     "a dense table must be float32"),
    ((mx.array([1]), Q.w, Q.scales), dict(bits=4, group_size=32), ValueError,
     "scales and biases must be given together"),
    ((mx.array([1]), Q.w, Q.scales, Q.biases), dict(bits=4), TypeError,
     "group_size must be an int"),
    ((mx.array([1]), Q.w, Q.scales, Q.biases), dict(bits=5, group_size=32), ValueError,
     "bits must be one of"),
    ((mx.array([1]), Q.w.astype(mx.int32), Q.scales, Q.biases), dict(bits=4, group_size=32),
     TypeError, "a quantized table must be uint32"),
    ((mx.array([1]), Q.w, Q.scales[:, :1], Q.biases), dict(bits=4, group_size=32), ValueError,
     "scales must be \\[V, D / group_size\\]"),
    ((mx.array([1]), Q.w, Q.scales, Q.biases.astype(mx.bfloat16)),
     dict(bits=4, group_size=32), TypeError, "biases dtype"),
])
def test_embedding_gather_rejects(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        linear.embedding_gather(*args, **kwargs)


def test_extension_checks_shapes_too():
    # validate=False (the fast linears, which check a layer once) leaves the checks to
    # the native op: a bad K is a ValueError, not a crash.
    with pytest.raises(ValueError, match="quantized_matmul: shapes of x"):
        linear.quantized_matmul(mx.zeros((1, 96)), Q.w, Q.scales, Q.biases, bits=4,
                                group_size=32, validate=False)
    with pytest.raises(ValueError, match="dense_matmul: x \\[..., K\\] and w \\[N, K\\]"):
        linear.dense_matmul(mx.zeros((1, 3)), mx.zeros((2, 4)), validate=False)
    with pytest.raises(ValueError, match="embedding_gather: ids must be an integer array"):
        linear.embedding_gather(mx.zeros((1,)), mx.zeros((2, 4)), validate=False)
