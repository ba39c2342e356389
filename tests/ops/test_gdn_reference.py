"""The Gated DeltaNet references (ops/reference.py: short_conv_ref, gated_delta_ref,
gated_delta_chunked_ref) against float64 numpy loops written from the recurrence,
mlx-lm's own ops, and themselves across chunk boundaries (a prompt split into chunks,
state carried in the slot, equals the prompt at once)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from vllm_metal.ops.reference import gated_delta_chunked_ref, gated_delta_ref, short_conv_ref

HK, HV, DK, DV, SLOTS = 2, 4, 8, 6, 5


def _batch(lengths, seed=0, vector_gate=False):
    rng = np.random.default_rng(seed)
    t = sum(lengths)
    q = rng.normal(size=(t, HK, DK)) / np.sqrt(DK)
    k = rng.normal(size=(t, HK, DK))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(t, HV, DV))
    g = rng.uniform(0.7, 1.0, size=(t, HV, DK) if vector_gate else (t, HV))
    beta = rng.uniform(0.0, 1.0, size=(t, HV))
    state = rng.normal(size=(SLOTS, HV, DV, DK))
    return q, k, v, g, beta, state


def gated_delta_oracle(q, k, v, g, beta, state, slots, lengths, has_state, delta=True):
    """float64, one scalar operation at a time; any head counts and widths. delta=False:
    the gated linear attention (S += beta * outer(v, k), no S k term)."""
    hk, hv, dv, dk = q.shape[1], v.shape[1], v.shape[2], q.shape[2]
    state = state.copy()
    y = np.zeros((q.shape[0], hv, dv))
    start = 0
    for slot, n, keep in zip(slots, lengths, has_state):
        s = state[slot].copy() if keep else np.zeros((hv, dv, dk))
        for t in range(start, start + n):
            for h in range(hv):
                kh, qh = k[t, h // (hv // hk)], q[t, h // (hv // hk)]
                decay = g[t, h] if g.ndim == 2 else g[t, h][None, :]
                s[h] = s[h] * decay
                error = v[t, h] - s[h] @ kh if delta else v[t, h]
                s[h] = s[h] + np.outer(error * beta[t, h], kh)
                y[t, h] = s[h] @ qh
        state[slot] = s
        start += n
    return y, state


def _run(q, k, v, g, beta, state, slots, lengths, has_state, delta=True, chunk=0):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    f32 = lambda a: mx.array(np.asarray(a, np.float32))  # noqa: E731
    args = (f32(q), f32(k), f32(v), f32(g), f32(beta), f32(state),
            mx.array(np.asarray(slots, np.int32)), mx.array(cu),
            mx.array(np.asarray(has_state, bool)))
    if chunk:
        y, new = gated_delta_chunked_ref(*args, chunk=chunk, delta=delta)
    else:
        y, new = gated_delta_ref(*args, delta=delta)
    return np.array(y, np.float64), np.array(new, np.float64)


@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
@pytest.mark.parametrize("vector_gate", [False, True])
def test_gated_delta_matches_float64_for_a_mixed_batch(vector_gate, delta):
    # A new prompt, a decode row, a prompt chunk continuing its state, a lone new row.
    lengths, slots, has_state = [7, 1, 5, 1], [3, 0, 4, 1], [False, True, True, False]
    args = _batch(lengths, seed=1, vector_gate=vector_gate)
    y, state = _run(*args, slots, lengths, has_state, delta=delta)
    want_y, want_state = gated_delta_oracle(*args, slots, lengths, has_state, delta=delta)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(state[2], np.float32(args[5][2]))  # a slot no sequence names


def test_gated_delta_chunks_carry_the_state():
    q, k, v, g, beta, state = _batch([13], seed=2)
    whole_y, whole_state = _run(q, k, v, g, beta, state, [2], [13], [False])
    ys, carried, start = [], state, 0
    for i, n in enumerate([5, 1, 7]):
        part = (a[start:start + n] for a in (q, k, v, g, beta))
        y, carried = _run(*part, carried, [2], [n], [i > 0])
        ys.append(y)
        start += n
    np.testing.assert_allclose(np.concatenate(ys), whole_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carried[2], whole_state[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 8])
@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
def test_the_chunked_form_matches_float64(delta, chunk):
    # Chunks of 3 split the 7- and 5-row requests mid-way; 8 holds each whole.
    lengths, slots, has_state = [7, 1, 0, 5, 1], [3, 0, 2, 4, 1], [False, True, True, True, False]
    args = _batch(lengths, seed=7)
    y, state = _run(*args, slots, lengths, has_state, delta=delta, chunk=chunk)
    want_y, want_state = gated_delta_oracle(*args, slots, lengths, has_state, delta=delta)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-5, atol=1e-5)


def test_the_chunked_form_survives_gates_of_zero_and_underflow():
    q, k, v, g, beta, state = _batch([12], seed=8)
    g[2], g[5:11] = 0.0, 1e-30  # six of 1e-30: a product far below float32's least
    g[11] = 1.0
    y, new = _run(q, k, v, g, beta, state, [1], [12], [True], chunk=12)
    want_y, want_state = gated_delta_oracle(q, k, v, g, beta, state, [1], [12], [True])
    assert np.isfinite(y).all() and np.isfinite(new).all()
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new, want_state, rtol=1e-5, atol=1e-5)


def test_linear_mode_is_a_decayed_sum_of_outer_products():
    # Without the delta rule, from zeros: S_t = sum_i (prod_{i<s<=t} g_s) beta_i v_i k_i^T.
    q, k, v, g, beta, state = _batch([6], seed=6)
    y, new = _run(q, k, v, g, beta, state, [0], [6], [False], delta=False)
    s = np.zeros((HV, DV, DK))
    for t in range(6):
        s = g[t][:, None, None] * s + np.einsum("h,hv,hk->hvk", beta[t], v[t],
                                                np.repeat(k[t], HV // HK, axis=0))
    np.testing.assert_allclose(new[0], s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y[5], np.einsum("hvk,hk->hv", s, np.repeat(q[5], HV // HK, 0)),
                               rtol=1e-5, atol=1e-6)


def test_gated_delta_matches_mlx_lm():
    from mlx_lm.models.gated_delta import gated_delta_ops

    q, k, v, g, beta, state = (np.asarray(a, np.float32) for a in _batch([9], seed=3))
    y, new = _run(q, k, v, g, beta, state, [1], [9], [True])
    want_y, want_state = gated_delta_ops(*(mx.array(a)[None] for a in (q, k, v, g, beta)),
                                         mx.array(state[1:2]))
    np.testing.assert_allclose(y, np.array(want_y[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new[1], np.array(want_state[0]), rtol=1e-5, atol=1e-5)


def short_conv_oracle(x, weight, conv_state, slots, lengths, has_state):
    kernel = weight.shape[1]
    state, ys, start = conv_state.copy(), [], 0
    for slot, n, keep in zip(slots, lengths, has_state):
        z = np.concatenate([state[slot] if keep else np.zeros_like(state[slot]),
                            x[start:start + n]])
        for t in range(n):
            ys.append([sum(weight[c, j] * z[t + j, c] for j in range(kernel))
                       for c in range(x.shape[1])])
        state[slot] = z[len(z) - (kernel - 1):]
        start += n
    return np.array(ys), state


def _conv(x, weight, conv_state, slots, lengths, has_state):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    y, state = short_conv_ref(mx.array(x.astype(np.float32)), mx.array(weight.astype(np.float32)),
                              mx.array(conv_state.astype(np.float32)),
                              mx.array(np.asarray(slots, np.int32)), mx.array(cu),
                              mx.array(np.asarray(has_state, bool)))
    return np.array(y, np.float64), np.array(state, np.float64)


def test_short_conv_matches_float64_and_carries_its_state():
    rng = np.random.default_rng(4)
    channels, kernel = 12, 4
    weight = rng.normal(size=(channels, kernel))
    conv_state = rng.normal(size=(SLOTS, kernel - 1, channels))
    lengths, slots, has_state = [6, 1, 2], [0, 3, 1], [False, True, True]
    x = rng.normal(size=(sum(lengths), channels))
    y, state = _conv(x, weight, conv_state, slots, lengths, has_state)
    want_y, want_state = short_conv_oracle(x, weight, conv_state, slots, lengths, has_state)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-6, atol=1e-6)
    # One 9-token prompt equals chunks of 2, 1, 6 with the state carried.
    x9 = rng.normal(size=(9, channels))
    whole, whole_state = _conv(x9, weight, conv_state, [4], [9], [False])
    parts, carried, start = [], conv_state, 0
    for i, n in enumerate([2, 1, 6]):
        part, carried = _conv(x9[start:start + n], weight, carried, [4], [n], [i > 0])
        parts.append(part)
        start += n
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(carried[4], whole_state[4], rtol=1e-6, atol=1e-6)


def test_short_conv_matches_mlx_depthwise_conv1d():
    """As mlx-lm's Qwen3-Next conv runs it: nn.Conv1d(groups=C) over [state; x]."""
    import mlx.nn as nn

    rng = np.random.default_rng(5)
    channels, kernel = 16, 4
    conv = nn.Conv1d(channels, channels, kernel, groups=channels, bias=False)
    weight = np.array(conv.weight)[:, :, 0]  # [C, K, 1] -> [C, K]
    start = rng.normal(size=(1, kernel - 1, channels)).astype(np.float32)
    x = rng.normal(size=(7, channels)).astype(np.float32)
    want = conv(mx.concatenate([mx.array(start), mx.array(x)[None]], axis=1))[0]
    state = np.zeros((SLOTS, kernel - 1, channels))
    state[2] = start[0]
    y, _ = _conv(x, weight, state, [2], [7], [True])
    np.testing.assert_allclose(y, np.array(want), rtol=1e-5, atol=1e-5)
