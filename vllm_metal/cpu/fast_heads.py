"""Per-head projections through vllm-metal's expert matmul: mlx-lm's MLA
``MultiLinear`` / ``QuantizedMultiLinear`` (embed_q, unembed_out) and
LatentAttention's ``HeadProjection`` (the W_UV cut from an expanded kv_b_proj).

A per-head product x[..., h, l, :] @ W[h].T is the expert matmul with each head an
expert and each row its own pair, so it runs on the SIMD linear kernels on the pool
instead of MLX's scalar single-threaded CPU ``quantized_matmul`` / 8 GFLOP/s
float matmul (benchmarks/bench_mla.py). Only the transposed product (W stored
[H, out, in], quantized along in) fits the op; the other form keeps MLX's.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.mla import MultiLinear, QuantizedMultiLinear

from vllm_metal.attention.latent_attention import HeadProjection
from vllm_metal.cpu.fast_experts import quantized_stack_ok
from vllm_metal.ops.experts import expert_matmul

_FLOATS = (mx.float32, mx.bfloat16, mx.float16)


def _per_head(module: nn.Module, x: mx.array) -> mx.array | None:
    """x [..., H, L, K] @ W[h].T per head -> [..., H, L, N], or None when x is not of
    that shape (the module's own product then runs)."""
    w = module["weight"]
    heads = w.shape[0]
    if x.ndim < 3 or x.shape[-3] != heads or x.dtype not in _FLOATS:
        return None
    idx = mx.broadcast_to(mx.arange(heads, dtype=mx.int32)[:, None], x.shape[:-1])
    rows = x.reshape(-1, x.shape[-1])
    if "scales" in module:
        out = expert_matmul(rows, idx.reshape(-1), w, module["scales"], module.get("biases"),
                            bits=module.bits, group_size=module.group_size,
                            mode=getattr(module, "mode", "affine"))
    else:
        out = expert_matmul(rows, idx.reshape(-1), w)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class FastMultiLinear(MultiLinear):
    def __call__(self, x: mx.array, transpose: bool = True) -> mx.array:
        out = _per_head(self, x) if transpose else None
        return super().__call__(x, transpose) if out is None else out


class FastQuantizedMultiLinear(QuantizedMultiLinear):
    def __call__(self, x: mx.array, transpose: bool = True) -> mx.array:
        out = _per_head(self, x) if transpose else None
        return super().__call__(x, transpose) if out is None else out


class FastHeadProjection(HeadProjection):
    def __call__(self, x: mx.array) -> mx.array:
        out = _per_head(self, x) if self.transpose else None
        return super().__call__(x) if out is None else out


FAST_HEAD_CLASSES = (FastMultiLinear, FastQuantizedMultiLinear, FastHeadProjection)


def fast_head_class(module: nn.Module) -> type | None:
    """The fast class for a per-head projection the op covers, else None (exact
    types only: a subclass may compute something else)."""
    kind = type(module)
    if kind not in (MultiLinear, QuantizedMultiLinear, HeadProjection):
        return None
    quantized = "scales" in module
    if kind is HeadProjection and not module.transpose:
        return None
    if quantized:
        ok = quantized_stack_ok(module)
    else:
        ok = module["weight"].ndim == 3 and module["weight"].dtype in _FLOATS
    if not ok:
        return None
    return {MultiLinear: FastMultiLinear, QuantizedMultiLinear: FastQuantizedMultiLinear,
            HeadProjection: FastHeadProjection}[kind]

