"""LatentAttention: an mlx-lm multi-head latent attention module (DeepSeek-V3,
GLM-4 MoE Lite, Mistral 4, Kimi K2.5, ...) over vLLM's paged latent cache.

mlx-lm's MLA modules cache the compressed KV row of each token (the normalised
latent and its rotated positional key) and attend by hand: positional scores as
an additive mask array, the latent either expanded per head (a prompt) or
absorbed into the queries (a decode step). A LayerCache cannot page that, so
modules of this shape are wrapped: the family's own projections, norms and RoPE
compute the rows, ``write_latent`` stores [latent, k_pe] per token, and
``attend_latent`` runs weight-absorbed attention over the cache for every row
(prompt or decode alike); ``unembed_out`` and ``o_proj`` finish as the family does.

mlx-lm's older MLA modules (DeepSeek-V2, MiniCPM3, Youtu) keep the per-head up
projection whole (``kv_b_proj``: [H * (nope + v), rank]) and cache expanded keys
and values; the wrapper splits it once at load into the absorbed pair (W_UK per
head for the queries, W_UV per head for the output), so they too cache one latent
row per token.

A module is wrapped only if it has the attributes that shape implies, and only
after one small prompt through the wrapper (on a scratch paged cache; once per
module class, the check being of its code) reproduced
the module's own dense forward; otherwise the model is refused by name.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import (AttentionMetadata, ForwardContext, forward_context,
                                          get_forward_context)
from vllm_metal.attention.layer_cache import LayerCache

_PARTS = ("kv_a_proj_with_mqa", "kv_a_layernorm", "o_proj", "rope")
_SIZES = ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")
# The softmax scale's attribute (DeepSeek's scale, MiniCPM3's softmax_scale).
_SCALES = ("scale", "softmax_scale")
# Rows of the load-time check, and how close it must come (fp32 arithmetic on both
# sides; the family expands the latent for a prompt, the wrapper absorbs it).
_CHECK_ROWS = 7
_CHECK_RTOL = {mx.float32: 1e-3}
_HALF_RTOL = 3e-2


def is_latent(module: nn.Module) -> bool:
    """The module has the parts of mlx-lm's MLA attention, absorbed (embed_q,
    unembed_out) or expanded (kv_b_proj with v_head_dim)."""
    has = lambda n: getattr(module, n, None) is not None  # noqa: E731
    queries = has("q_proj") or all(has(n) for n in ("q_a_proj", "q_a_layernorm", "q_b_proj"))
    up = (has("embed_q") and has("unembed_out")) or (has("kv_b_proj") and has("v_head_dim"))
    return (queries and up and any(has(n) for n in _SCALES)
            and all(has(n) for n in _PARTS + _SIZES))


class HeadProjection(nn.Module):
    """x [..., H, L, k] -> [..., H, L, n] through one matrix per head, float or MLX
    affine-quantized, stored [H, k, n] (``transpose`` False) or [H, n, k] (True) as
    cut from kv_b_proj's rows (a quantized row keeps its groups)."""

    def __init__(self, weight: mx.array, scales: mx.array | None, biases: mx.array | None,
                 bits: int, group_size: int, transpose: bool) -> None:
        super().__init__()
        self.weight = weight
        if scales is not None:
            self.scales = scales
            if biases is not None:
                self.biases = biases
        self.bits, self.group_size, self.transpose = bits, group_size, transpose
        self.mode = "affine"  # rows cut from an MLX affine (or float) kv_b_proj
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        if "scales" in self:
            return mx.quantized_matmul(x, self["weight"], self["scales"], self.get("biases"),
                                       transpose=self.transpose, group_size=self.group_size,
                                       bits=self.bits)
        w = self["weight"]
        return x @ (w.swapaxes(-1, -2) if self.transpose else w)


def _split_up_projection(inner: nn.Module) -> tuple[HeadProjection, HeadProjection]:
    """(W_UK, W_UV) of an expanded module's kv_b_proj [H * (nope + v), rank]: the
    queries' map into the latent space (q_nope @ W_UK[h], [H, nope, rank]) and the
    latent outputs' map to values (out @ W_UV[h].T, [H, v, rank]), cut from its rows
    as stored (quantized rows stay quantized)."""
    heads, nope = int(inner.num_heads), int(inner.qk_nope_head_dim)
    up = inner.kv_b_proj
    if "bias" in up:
        raise ValueError("its kv_b_proj has a bias, which the absorbed form cannot carry")
    quantized = "scales" in up
    if quantized and getattr(up, "mode", "affine") != "affine":
        raise ValueError(f"its kv_b_proj is quantized in mode {up.mode!r}")
    parts = [up["weight"]] + ([up["scales"], up.get("biases")] if quantized else [])

    def cut(lo, hi):
        return [None if a is None else
                mx.contiguous(a.reshape(heads, -1, a.shape[-1])[:, lo:hi]) for a in parts]

    bits, group = (up.bits, up.group_size) if quantized else (0, 0)
    k = cut(0, nope)
    v = cut(nope, None)
    pad = [None, None] if not quantized else []
    uk = HeadProjection(*(k + pad), bits, group, transpose=False)
    uv = HeadProjection(*(v + pad), bits, group, transpose=True)
    mx.eval(uk.parameters(), uv.parameters())
    return uk, uv


class _UpProjections:
    """The wrapper's (embed_q, unembed_out) callables, held outside the module tree
    (the absorbed kind's belong to the family's module already)."""

    def __init__(self, embed_q, unembed_out) -> None:
        self.embed_q, self.unembed_out = embed_q, unembed_out


class LatentAttention(nn.Module):
    """Wraps one MLA module; x [total_q, 1, hidden] (one token per row) -> same shape."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.num_heads = int(inner.num_heads)
        self.nope = int(inner.qk_nope_head_dim)
        self.rope_dim = int(inner.qk_rope_head_dim)
        self.rank = int(inner.kv_lora_rank)
        self.scale = float(next(getattr(inner, n) for n in _SCALES
                                if getattr(inner, n, None) is not None))
        # Mistral 4 passes a per-position query scale (Llama 4's): attn_scale [T, 1, 1, 1]
        # here, multiplying both query halves after RoPE as its module does.
        self._signature = inspect.signature(type(inner).__call__)
        self.takes_scale = "attn_scale" in self._signature.parameters
        if getattr(inner, "embed_q", None) is not None:
            self._up = _UpProjections(inner.embed_q, inner.unembed_out)
        else:
            self.kv_b_uk, self.kv_b_uv = _split_up_projection(inner)
            self._up = _UpProjections(self.kv_b_uk, self.kv_b_uv)
            self.expanded = True

    def drop_expanded(self) -> None:
        """Free the family's kv_b_proj once the wrapper is checked: its rows now live
        in kv_b_uk and kv_b_uv."""
        if getattr(self, "expanded", False) and "kv_b_proj" in self.inner:
            del self.inner["kv_b_proj"]

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        """The inner module's own signature (x, [attn_scale,] mask, cache)."""
        bound = self._signature.bind(self.inner, x, *args, **kwargs).arguments
        cache, attn_scale = bound.get("cache"), bound.get("attn_scale")
        if not isinstance(cache, LayerCache):
            raise RuntimeError("LatentAttention runs only inside a paged forward")
        inner = self.inner
        rows, length, _ = x.shape
        heads, rank = self.num_heads, self.rank
        if getattr(inner, "q_proj", None) is not None:
            q = inner.q_proj(x)
        else:
            q = inner.q_b_proj(inner.q_a_layernorm(inner.q_a_proj(x)))
        q = q.reshape(rows, length, heads, self.nope + self.rope_dim).transpose(0, 2, 1, 3)
        q_nope, q_pe = mx.split(q, [self.nope], axis=-1)
        compressed, k_pe = mx.split(inner.kv_a_proj_with_mqa(x), [rank], axis=-1)
        k_pe = k_pe.reshape(rows, length, 1, self.rope_dim).transpose(0, 2, 1, 3)
        latent = inner.kv_a_layernorm(compressed)
        q_pe = inner.rope(q_pe, cache.offset)
        k_pe = inner.rope(k_pe, cache.offset)
        if attn_scale is not None:
            q_nope, q_pe = q_nope * attn_scale, q_pe * attn_scale
        ctx = get_forward_context()
        ctx.write_latent(cache.entry, latent.reshape(rows, rank),
                         k_pe.reshape(rows, self.rope_dim).astype(latent.dtype))
        q_latent = self._up.embed_q(q_nope).reshape(rows, heads, rank)
        out = ctx.attend_latent(cache.entry, q_latent,
                                q_pe.reshape(rows, heads, self.rope_dim).astype(q_latent.dtype),
                                self.scale)
        out = self._up.unembed_out(out[:, :, None, :])  # [rows, heads, 1, v_head_dim]
        return inner.o_proj(out.transpose(0, 2, 1, 3).reshape(rows, length, -1))


def check_latent(wrapper: LatentAttention, hidden: int, dtype: mx.Dtype) -> str | None:
    """None if the wrapper reproduces its module's dense forward on a small prompt,
    else what differs."""
    inner = wrapper.inner
    rows = _CHECK_ROWS
    x = (0.5 * mx.random.normal((rows, hidden), key=mx.random.key(3))).astype(dtype)
    causal = mx.tril(mx.ones((rows, rows), dtype=mx.bool_))
    # A query scale that differs per position, in each side's layout.
    scale = 1.0 + 0.25 * mx.arange(rows, dtype=mx.float32)
    dense_extra = {"attn_scale": scale[:, None].astype(dtype)} if wrapper.takes_scale else {}
    paged_extra = ({"attn_scale": scale[:, None, None, None].astype(dtype)}
                   if wrapper.takes_scale else {})
    want = inner(x[None], mask=causal, cache=None, **dense_extra)[0]
    block = 16
    blocks = -(-rows // block)
    cache = mx.zeros((blocks + 1, block, 1, wrapper.rank + wrapper.rope_dim), dtype=want.dtype)
    i32 = lambda v: mx.array(v, dtype=mx.int32)  # noqa: E731
    meta = AttentionMetadata(i32(list(range(rows))), i32([0, rows]), i32([rows]),
                             [i32([list(range(1, blocks + 1))])],
                             [i32([block + r for r in range(rows)])])
    with forward_context(ForwardContext(meta, [cache], [None])):
        got = wrapper(x[:, None, :], cache=LayerCache(0), **paged_extra)[:, 0]
    want, got = want.astype(mx.float32), got.astype(mx.float32)
    scale = max(float(mx.abs(want).max()), 1e-6)
    error = float(mx.abs(got - want).max()) / scale
    if error <= _CHECK_RTOL.get(want.dtype if dtype == mx.float32 else dtype, _HALF_RTOL):
        return None
    return f"the paged latent attention differs from the module's own forward by {error:.2g}"
