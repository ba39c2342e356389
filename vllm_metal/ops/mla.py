"""Multi-head latent attention ops as lazy MLX graph nodes (native kernels of
``vllm_metal._ext``: kernels_v2/mla.metal on the GPU once the Metal kernels are
loaded, else csrc/cpu/mla on the CPU stream; vllm_metal.ops.reference holds the
pure-MLX versions).

The latent cache is vLLM's MLA layout: one row per token, ``[latent (rank),
k_pe (rope_dim)]``, in pages ``[num_blocks, block_size, rank + rope_dim]``. The
extension checks shapes and dtypes (ValueError naming the argument); metadata
that can only be checked on data raises when the result is evaluated.
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["latent_cache_write", "mla_attention"]


def _stream() -> mx.DeviceType | None:
    # As the paged attention ops: the default (GPU) stream with the Metal kernels
    # loaded (the op falls back to the CPU for what they do not cover), else the CPU.
    return None if get_ops().metal_kernels_loaded() else mx.cpu


def latent_cache_write(latent: mx.array, k_pe: mx.array, cache: mx.array,
                       slot_mapping: mx.array) -> mx.array:
    """latent [T, rank], k_pe [T, rope_dim] into cache [num_blocks, block_size,
    rank + rope_dim] at slot_mapping [T] (negative: skipped), in place; returns the
    cache (use the result, so the graph orders the write before reads)."""
    return get_ops().latent_cache_write(latent, k_pe, cache, slot_mapping, stream=_stream())


def mla_attention(q_latent: mx.array, q_pe: mx.array, cache: mx.array, block_tables: mx.array,
                  seq_lens: mx.array, cu_seqlens_q: mx.array, scale: float) -> mx.array:
    """Weight-absorbed MLA: q_latent [T, H, rank] (each head's query times W_UK),
    q_pe [T, H, rope_dim] -> [T, H, rank], softmax(scale * (q_latent . c + q_pe . k_pe))
    @ c over each sequence's cached tokens up to the row's position."""
    return get_ops().mla_attention(q_latent, q_pe, cache, block_tables, seq_lens, cu_seqlens_q,
                                   float(scale), stream=_stream())
