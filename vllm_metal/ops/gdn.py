"""Gated DeltaNet ops over a packed batch whose per-request states live in KV
cache pages (attention/caches/state_pages.py says where).

Rows of several requests arrive packed ([T, ...], ``cu_seqlens`` [N + 1]); request
n reads and writes its state in block ``slots[n]`` of the pages, starting from
zeros when ``has_state[n]`` is 0 (a fresh prompt or a recomputed one).

For now both are the pure-MLX references (vllm_metal.ops.reference); the native
kernels take their place behind these same signatures.
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.ops.reference import gated_delta_pages_ref, short_conv_pages_ref

__all__ = ["gated_delta", "short_conv"]


def short_conv(x: mx.array, weight: mx.array, lo: mx.array, slots: mx.array,
               cu_seqlens: mx.array, has_state: mx.array) -> tuple[mx.array, mx.array]:
    """x [T, C], weight [C, K], lo [num_blocks, half_floats] float32 -> (y [T, C] in x's
    dtype, lo): the depthwise causal conv (no activation), each request continuing
    from its last K - 1 inputs at lo[slot, :(K-1)*C], which it updates."""
    return short_conv_pages_ref(x, weight, lo, slots, cu_seqlens, has_state)


def gated_delta(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                lo: mx.array, hi: mx.array, slots: mx.array, cu_seqlens: mx.array,
                has_state: mx.array, ssm_offset: int,
                heads_in_lo: int) -> tuple[mx.array, mx.array, mx.array]:
    """q, k [T, Hk, Dk] (normalised, q scaled, as the family does), v [T, Hv, Dv],
    g [T, Hv] or [T, Hv, Dk] (the decay), beta [T, Hv] -> (y [T, Hv, Dv] in q's dtype,
    lo, hi). Per token, per value head: S = g * S; S += outer(beta * (v - S k), k);
    y = S q, from and into the head's [Dv, Dk] float32 state in the pages."""
    return gated_delta_pages_ref(q, k, v, g, beta, lo, hi, slots, cu_seqlens, has_state,
                                 ssm_offset, heads_in_lo)
