"""Multi-head latent attention ops as lazy MLX graph nodes (CPU kernels of
``vllm_metal._ext``; csrc/cpu/mla/mla_cpu.h has the maths,
vllm_metal.ops.reference the pure-MLX versions).

The latent cache is vLLM's MLA layout: one row per token, ``[latent (rank),
k_pe (rope_dim)]``, in pages ``[num_blocks, block_size, rank + rope_dim]``. The
extension checks shapes and dtypes (ValueError naming the argument); metadata
that can only be checked on data raises when the result is evaluated.
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["latent_cache_write", "mla_attention"]

_CPU = mx.cpu


def latent_cache_write(latent: mx.array, k_pe: mx.array, cache: mx.array,
                       slot_mapping: mx.array) -> mx.array:
    """latent [T, rank], k_pe [T, rope_dim] into cache [num_blocks, block_size,
    rank + rope_dim] at slot_mapping [T] (negative: skipped), in place; returns the
    cache (use the result, so the graph orders the write before reads)."""
    return get_ops().latent_cache_write(latent, k_pe, cache, slot_mapping, stream=_CPU)


def mla_attention(q_latent: mx.array, q_pe: mx.array, cache: mx.array, block_tables: mx.array,
                  seq_lens: mx.array, cu_seqlens_q: mx.array, scale: float) -> mx.array:
    """Weight-absorbed MLA: q_latent [T, H, rank] (each head's query times W_UK),
    q_pe [T, H, rope_dim] -> [T, H, rank], softmax(scale * (q_latent . c + q_pe . k_pe))
    @ c over each sequence's cached tokens up to the row's position."""
    return get_ops().mla_attention(q_latent, q_pe, cache, block_tables, seq_lens, cu_seqlens_q,
                                   float(scale), stream=_CPU)
