"""The paged KV cache: one K and one V array per layer, shared with the kernels."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


class PagedKVCache:
    """Per layer K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].

    Block ids come from vLLM's block manager; block 0 is its null block.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: mx.Dtype) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.key_caches = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.value_caches = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        mx.eval(self.key_caches, self.value_caches)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int,
                        head_dim: int, dtype: mx.Dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.key_caches) + sum(a.nbytes for a in self.value_caches)

    def copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` in every layer (copy-on-write hits)."""
        if not src:
            return
        src_idx = mx.array(np.asarray(src, dtype=np.int32))
        dst_idx = mx.array(np.asarray(dst, dtype=np.int32))
        for caches in (self.key_caches, self.value_caches):
            for i, cache in enumerate(caches):
                cache[dst_idx] = cache[src_idx]
                caches[i] = cache
        mx.eval(self.key_caches, self.value_caches)

    def zero_blocks(self, block_ids: Sequence[int]) -> None:
        """Zero whole blocks in every layer (vLLM asks for it on some configs)."""
        if not block_ids:
            return
        idx = mx.array(np.asarray(block_ids, dtype=np.int32))
        for caches in (self.key_caches, self.value_caches):
            for cache in caches:
                cache[idx] = 0
        mx.eval(self.key_caches, self.value_caches)
