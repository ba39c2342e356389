"""Gated DeltaNet ops over a packed batch whose per-request states live in KV
cache pages (attention/caches/state_pages.py says where), as lazy MLX graph nodes
(native kernels of ``vllm_metal._ext``: kernels_v2/gdn.metal on the GPU once the
Metal kernels are loaded, else csrc/cpu/gdn on the CPU stream;
vllm_metal.ops.reference holds the pure-MLX versions).

Rows of several requests arrive packed ([T, ...], ``cu_seqlens`` [N + 1]); request
n reads and writes its state in block ``slots[n]`` of the pages, starting from
zeros when ``has_state[n]`` is 0 (a fresh prompt or a recomputed one). The pages
come back as the same buffers, written in place when the result is evaluated: use
the returned pages afterwards, so the graph orders the write first. The extension
checks shapes and dtypes (ValueError naming the argument); slots and cu_seqlens
are checked on their data when the result is evaluated.
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["gated_delta", "short_conv"]


def _stream() -> mx.DeviceType | None:
    # As the MLA ops: the default (GPU) stream with the Metal kernels loaded (the
    # op falls back to the CPU for what they do not cover), else the CPU.
    return None if get_ops().metal_kernels_loaded() else mx.cpu


def short_conv(x: mx.array, weight: mx.array, lo: mx.array, slots: mx.array,
               cu_seqlens: mx.array, has_state: mx.array,
               conv_offset: int = 0) -> tuple[mx.array, mx.array]:
    """x [T, C], weight [C, K], lo [num_blocks, half_floats] float32 -> (y [T, C] in x's
    dtype, lo): the depthwise causal conv (no activation), each request continuing
    from its last K - 1 inputs at lo[slot, conv_offset:][:(K-1)*C], which it updates
    (conv_offset: where this conv's state sits after a mixer's earlier convs)."""
    return get_ops().gdn_short_conv(x, weight, lo, slots, cu_seqlens, has_state,
                                    int(conv_offset), stream=_stream())


def gated_delta(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                lo: mx.array, hi: mx.array, slots: mx.array, cu_seqlens: mx.array,
                has_state: mx.array, ssm_offset: int, heads_in_lo: int, *,
                delta: bool = True, chunk: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """q, k [T, Hk, Dk] (normalised, q scaled, as the family does), v [T, Hv, Dv],
    g [T, Hv] or [T, Hv, Dk] (the decay), beta [T, Hv] -> (y [T, Hv, Dv] in q's dtype,
    lo, hi). Per token, per value head: S = g * S; S += outer(beta * (v - S k), k);
    y = S q, from and into the head's [Dv, Dk] float32 state in the pages.

    delta=False drops the delta rule's "- S k": S = g * S; S += beta * outer(v, k);
    y = S q, the gated linear attention of Mamba2's SSD mixers.

    chunk=0 runs token by token. chunk=32 or 64 (scalar g [T, Hv] only; a vector gate
    keeps the recurrence) runs the chunked (WY) form in chunks of that many rows from
    each request's first row in the step, a last chunk of fewer than 8 rows (a decode
    row, a prompt's tail) token by token: the same maths in matrix products, faster
    over a prompt, but rounded differently, and its result depends on where the chunks
    start (a prompt in two steps differs in the last bits from the prompt at once).
    Any other value raises ValueError naming chunk."""
    return get_ops().gdn_gated_delta(q, k, v, g, beta, lo, hi, slots, cu_seqlens, has_state,
                                     int(ssm_offset), int(heads_in_lo), bool(delta), int(chunk),
                                     stream=_stream())
