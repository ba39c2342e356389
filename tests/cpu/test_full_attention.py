"""Unmasked attention on the paged kernel (vllm_metal.cpu.full_attention) against a
numpy float64 softmax(QK^T)V: batches, grouped heads, key counts that do not fill a
page, and MLX's function left alone outside the context or with a mask."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from vllm_metal.cpu.full_attention import attend_all, full_attention


def _reference(q, k, v, scale):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("b,heads,kv_heads,lq,lk,d", [
    (1, 4, 4, 37, 37, 64), (2, 8, 2, 5, 33, 80), (3, 2, 1, 16, 16, 128), (1, 16, 16, 1, 1, 72),
    (2, 4, 4, 40, 9, 64),   # more queries than keys: a sequence per query row
    (1, 6, 6, 300, 300, 64),  # several key tiles for each query tile
])
def test_every_query_attends_to_every_key(b, heads, kv_heads, lq, lk, d):
    rng = np.random.default_rng(b * 100 + lk)
    q = rng.normal(size=(b, heads, lq, d)).astype(np.float32)
    k = rng.normal(size=(b, kv_heads, lk, d)).astype(np.float32)
    v = rng.normal(size=(b, kv_heads, lk, d)).astype(np.float32)
    got = attend_all(mx.array(q), mx.array(k), mx.array(v), d ** -0.5)
    np.testing.assert_allclose(np.array(got), _reference(q, k, v, d ** -0.5), atol=2e-5)


def test_the_context_routes_unmasked_calls_only():
    q = mx.random.normal((1, 2, 6, 64))
    mask = mx.array(np.tril(np.ones((6, 6), bool)))
    original = mx.fast.scaled_dot_product_attention
    with full_attention():
        assert mx.fast.scaled_dot_product_attention is not original
        masked = mx.fast.scaled_dot_product_attention(q, q, q, scale=0.125, mask=mask)
        unmasked = mx.fast.scaled_dot_product_attention(q, q, q, scale=0.125)
    assert mx.fast.scaled_dot_product_attention is original
    np.testing.assert_allclose(np.array(masked),
                               np.array(original(q, q, q, scale=0.125, mask=mask)), atol=1e-6)
    np.testing.assert_allclose(np.array(unmasked), _reference(q, q, q, 0.125), atol=2e-5)
