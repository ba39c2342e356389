"""PagedAttention: a drop-in for an mlx-lm attention module that reads and
writes vLLM's paged KV cache instead of mlx-lm's per-request cache."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal import ops
from vllm_metal.attention.context import get_forward_context


class PagedAttention(nn.Module):
    """Wraps one attention module; keeps its projections, norms and RoPE.

    Input ``x`` [1, total_q, hidden] holds every scheduled token of the step,
    packed; returns [1, total_q, hidden].
    """

    def __init__(self, inner: nn.Module, layer_index: int, *,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.layer_index = layer_index
        self.sliding_window = sliding_window
        self.num_heads = int(inner.n_heads)
        self.num_kv_heads = int(inner.n_kv_heads)
        self.head_dim = _head_dim(inner)
        self.scale = float(inner.scale)
        self.softcap = getattr(inner, "attn_logit_softcapping", None)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        # mask and cache belong to mlx-lm's dense path; paging replaces both.
        ctx = get_forward_context()
        meta = ctx.metadata
        inner = self.inner
        batch, total_q, _ = x.shape
        if batch != 1:
            raise ValueError(f"PagedAttention expects one packed sequence, got batch {batch}")

        q = inner.q_proj(x).reshape(total_q, self.num_heads, self.head_dim)
        k = inner.k_proj(x).reshape(total_q, self.num_kv_heads, self.head_dim)
        v = inner.v_proj(x).reshape(total_q, self.num_kv_heads, self.head_dim)
        if hasattr(inner, "q_norm"):
            q = inner.q_norm(q)
            k = inner.k_norm(k)

        # RoPE rotates along axis -2 with one offset per leading index: giving
        # each token its own [heads, 1, D] slice applies its own position.
        q = inner.rope(q[:, :, None, :], offset=meta.positions)[:, :, 0, :]
        k = inner.rope(k[:, :, None, :], offset=meta.positions)[:, :, 0, :]

        i = self.layer_index
        key_cache, value_cache = ops.reshape_and_cache(
            k, v, ctx.key_caches[i], ctx.value_caches[i], meta.slot_mapping)
        ctx.key_caches[i] = key_cache
        ctx.value_caches[i] = value_cache

        out = ops.paged_attention(
            q, key_cache, value_cache, meta.block_tables, meta.seq_lens,
            meta.cu_seqlens_q, self.scale, sliding_window=self.sliding_window,
            softcap=self.softcap)
        return inner.o_proj(out.reshape(1, total_q, self.num_heads * self.head_dim))


def _head_dim(inner: nn.Module) -> int:
    head_dim = getattr(inner, "head_dim", None)
    if head_dim:
        return int(head_dim)
    # weight is [out_features, ...] for dense and quantized linears alike.
    return int(inner.q_proj.weight.shape[0]) // int(inner.n_heads)
