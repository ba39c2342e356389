"""quantized_matmul's argmax_columns (greedy decoding from the head without a
logits array) against mx.argmax of the op's own products, which is what the
model runner took before, and the head-level wiring (LoadedModel.greedy_tokens).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import make_quantized, random_float
from tests.tiny_models import cached_tiny_model
from vllm_metal.ops import linear
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.v1.model_lifecycle import load_model

# Past 8192 columns the kernel splits a row into pieces on the pool.
N, K = 20000, 64


def products(x, q, int8, bias=None, **kw):
    return linear.quantized_matmul(x, *q.args(), bits=q.bits, group_size=q.group_size,
                                   bias=bias, int8_activations=int8, **kw)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("columns", [N, N // 2 + 3, 1])
def test_argmax_equals_mx_argmax_of_the_products(bits, int8, m, columns):
    q = make_quantized(N, K, bits, 32, scale_dtype=mx.float16 if int8 else mx.float32, seed=bits)
    x = random_float((m, K), seed=m)
    got = products(x, q, int8, argmax_columns=columns)
    want = mx.argmax(products(x, q, int8)[:, :columns], axis=-1)
    assert got.dtype == mx.int32 and got.shape == (m,)
    np.testing.assert_array_equal(np.array(got), np.array(want))


def test_bias_and_leading_dimensions():
    q = make_quantized(N, K, 4, 64)
    x = random_float((2, 3, K), seed=5)
    bias = random_float((N,), seed=6, scale=30.0)
    got = products(x, q, False, bias=bias, argmax_columns=N)
    want = mx.argmax(products(x, q, False, bias=bias), axis=-1)
    assert got.shape == (2, 3)
    np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("first,second", [(100, 9000), (8191, 8192), (12000, 19999)])
def test_ties_go_to_the_first_index_across_pieces(first, second):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.01
    w[first] = w[second] = 1.0          # equal rows: equal (largest) products
    wq, scales, biases = mx.quantize(mx.array(w), group_size=32, bits=8)
    x = mx.ones((1, K))
    got = linear.quantized_matmul(x, wq, scales, biases, bits=8, group_size=32,
                                  argmax_columns=N)
    assert int(got.item()) == first == int(mx.argmax(mx.quantized_matmul(
        x, wq, scales, biases, transpose=True, group_size=32, bits=8), axis=-1).item())


def test_nan_rows_take_the_first_nan_as_mx_argmax_does():
    q = make_quantized(N, K, 4, 32)
    x = random_float((2, K), seed=1)
    x = mx.concatenate([x[:1], mx.full((1, K), float("nan"))])
    got = np.array(products(x, q, False, argmax_columns=N))
    want = np.array(mx.argmax(products(x, q, False), axis=-1))
    np.testing.assert_array_equal(got, want)
    assert got[1] == 0


def test_bad_argmax_columns_are_refused():
    q = make_quantized(64, K, 4, 32)
    x = random_float((1, K))
    for bad in (65, -1):
        with pytest.raises(ValueError, match="argmax_columns"):
            products(x, q, False, argmax_columns=bad)
    for bad in (1.5, True, "3"):
        with pytest.raises(TypeError, match="argmax_columns"):
            products(x, q, False, argmax_columns=bad)
    q16 = make_quantized(64, K, 4, 32, scale_dtype=mx.float16)
    with pytest.raises(ValueError, match="float32 result"):
        products(x.astype(mx.float16), q16, False, argmax_columns=8)


@pytest.mark.parametrize("family", ["llama", "mistral"])   # separate head, tied head
def test_greedy_tokens_is_the_argmax_of_the_heads_logits(family):
    loaded = load_model(str(cached_tiny_model(family, quantize_bits=4)), mx.float32, CpuBackend())
    hidden = random_float((5, loaded.model.args.hidden_size), seed=3, scale=4.0)
    vocab = loaded.dims.vocab_size - 7
    got = loaded.greedy_tokens(hidden, vocab)
    assert got is not None
    want = mx.argmax(loaded.logits(hidden)[:, :vocab], axis=-1)
    np.testing.assert_array_equal(np.array(got), np.array(want))


def test_greedy_tokens_declines_float_heads_and_a_vocab_past_the_head():
    loaded = load_model(str(cached_tiny_model("llama")), mx.float32, CpuBackend())
    hidden = random_float((2, loaded.model.args.hidden_size))
    assert loaded.greedy_tokens(hidden, loaded.dims.vocab_size) is None
    quantized = load_model(str(cached_tiny_model("llama", quantize_bits=4)), mx.float32,
                           CpuBackend())
    assert quantized.greedy_tokens(hidden, quantized.dims.vocab_size + 1) is None


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("columns", [N, N - 5])
@pytest.mark.parametrize("density", [0.5, 0.001])
def test_the_bitmask_takes_the_argmax_of_what_it_admits(m, columns, density):
    from tests.ops.test_sample_tokens import random_bitmask

    q = make_quantized(N, K, 4, 32, seed=7)
    x = random_float((m, K), seed=m + 1)
    rng = np.random.default_rng(m)
    bitmask, allowed = random_bitmask(rng, m, columns, density)
    got = np.array(products(x, q, False, argmax_columns=columns,
                            argmax_allowed=mx.array(bitmask)))
    logits = np.array(products(x, q, False))[:, :columns]
    want = np.argmax(np.where(allowed, logits, -np.inf), axis=-1)
    np.testing.assert_array_equal(got, want)


def test_nan_and_empty_rows_under_the_bitmask():
    # A NaN the bitmask admits wins (mx.argmax's order); one it does not is ignored;
    # a row admitting nothing gives 0, as -inf logits would.
    q = make_quantized(N, K, 4, 32)
    x = mx.concatenate([mx.full((1, K), float("nan")), random_float((2, K), seed=2)])
    logits = np.array(products(x, q, False))
    words = -(-N // 32)
    bits = np.zeros((3, words), np.uint32)
    bits[0, 300] = 1 << 4                       # admits column 9604 (a NaN)
    bits[1, :] = 0xFFFFFFFF
    got = np.array(products(x, q, False, argmax_columns=N, argmax_allowed=mx.array(bits)))
    assert got[0] == 300 * 32 + 4
    assert got[1] == np.argmax(logits[1])
    assert got[2] == 0


def test_a_bad_bitmask_is_refused():
    q = make_quantized(64, K, 4, 32)
    x = random_float((2, K))
    with pytest.raises(ValueError, match="argmax_allowed"):
        products(x, q, False, argmax_allowed=mx.zeros((2, 2), dtype=mx.uint32))
    for bad in (mx.zeros((2, 1), dtype=mx.uint32), mx.zeros((3, 2), dtype=mx.uint32),
                mx.zeros((2, 2), dtype=mx.int32)):
        with pytest.raises(ValueError, match="argmax_allowed"):
            products(x, q, False, argmax_columns=64, argmax_allowed=bad)


def test_greedy_tokens_takes_the_grammars_bitmask():
    loaded = load_model(str(cached_tiny_model("llama", quantize_bits=4)), mx.float32,
                        CpuBackend())
    from tests.ops.test_sample_tokens import random_bitmask

    hidden = random_float((4, loaded.model.args.hidden_size), seed=8, scale=4.0)
    vocab = loaded.dims.vocab_size
    bitmask, allowed = random_bitmask(np.random.default_rng(3), 4, vocab, 0.1)
    got = loaded.greedy_tokens(hidden, vocab, mx.array(bitmask))
    want = np.argmax(np.where(allowed, np.array(loaded.logits(hidden)), -np.inf), axis=-1)
    np.testing.assert_array_equal(np.array(got), want)
