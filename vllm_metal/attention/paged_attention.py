"""PagedAttention: stands in for an mlx-lm attention module that computes its
scores itself instead of calling ``scaled_dot_product_attention`` (so a
LayerCache alone cannot page it).

Only modules listed in SELF_COMPUTING are wrapped: each was read and found to
be plain projections, RoPE at the cache offset, ``scale`` and an optional
``attn_logit_softcapping`` over a causal mask. Any other module that computes
attention itself is refused at load (models.adapter), never guessed at.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import get_forward_context
from vllm_metal.attention.layer_cache import LayerCache, mask_window

# (module, class) of the self-computing attention modules PagedAttention reproduces.
SELF_COMPUTING = {("mlx_lm.models.gemma2", "Attention")}


def wraps(module: nn.Module) -> bool:
    kind = type(module)
    return (kind.__module__, kind.__name__) in SELF_COMPUTING


class PagedAttention(nn.Module):
    """Wraps one self-computing attention module; keeps its projections and RoPE.

    ``x`` [total_q, 1, hidden] (one token per row) -> [total_q, 1, hidden].
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.num_heads = int(inner.n_heads)
        self.num_kv_heads = int(inner.n_kv_heads)
        self.head_dim = int(inner.head_dim)
        self.scale = float(inner.scale)
        self.softcap = getattr(inner, "attn_logit_softcapping", None)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if not isinstance(cache, LayerCache):
            raise RuntimeError("PagedAttention runs only inside a paged forward")
        inner = self.inner
        rows, length, _ = x.shape
        q = inner.q_proj(x).reshape(rows, length, self.num_heads, -1).transpose(0, 2, 1, 3)
        k = inner.k_proj(x).reshape(rows, length, self.num_kv_heads, -1).transpose(0, 2, 1, 3)
        v = inner.v_proj(x).reshape(rows, length, self.num_kv_heads, -1).transpose(0, 2, 1, 3)
        q = inner.rope(q, offset=cache.offset)
        k = inner.rope(k, offset=cache.offset)
        cache.update_and_fetch(k, v)
        out = get_forward_context().attend(cache.entry, q, self.scale,
                                           mask_window(mask, cache.entry), softcap=self.softcap)
        return inner.o_proj(out.transpose(0, 2, 1, 3).reshape(rows, length, -1))
