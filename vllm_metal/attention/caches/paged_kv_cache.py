"""The paged KV cache: one K and one V array per layer, shared with the kernels."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np


class PagedKVCache:
    """Per KV entry (layer) K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].

    Block ids come from vLLM's block manager; block 0 is its null block. With
    vLLM's hybrid cache, entries of different KV cache groups share one buffer
    (``tensor_of``): a block id belongs to one group at a time, so their rows
    never meet; ``groups`` says which block table each entry reads.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: mx.Dtype, *,
                 tensor_of: Sequence[int] | None = None,
                 groups: Sequence[int] | None = None) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.tensor_of = list(range(num_layers)) if tensor_of is None else list(tensor_of)
        self.groups = None if groups is None else list(groups)
        keys = {t: mx.zeros(shape, dtype=dtype) for t in sorted(set(self.tensor_of))}
        values = {t: mx.zeros(shape, dtype=dtype) for t in keys}
        self.key_caches = [keys[t] for t in self.tensor_of]
        self.value_caches = [values[t] for t in self.tensor_of]
        mx.eval(self.key_caches, self.value_caches)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int,
                        head_dim: int, dtype: mx.Dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.size

    def buffers(self) -> list[mx.array]:
        """Each distinct K and V buffer once."""
        first = {}
        for entry, t in enumerate(self.tensor_of):
            first.setdefault(t, entry)
        return [caches[e] for caches in (self.key_caches, self.value_caches)
                for e in first.values()]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.buffers())

    def copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` in every buffer (copy-on-write hits)."""
        if not src:
            return
        src_idx = mx.array(np.asarray(src, dtype=np.int32))
        dst_idx = mx.array(np.asarray(dst, dtype=np.int32))
        self._update_buffers(lambda cache: _set_rows(cache, dst_idx, cache[src_idx]))

    def zero_blocks(self, block_ids: Sequence[int]) -> None:
        """Zero whole blocks in every buffer (vLLM asks for it on some configs)."""
        if not block_ids:
            return
        idx = mx.array(np.asarray(block_ids, dtype=np.int32))
        self._update_buffers(lambda cache: _set_rows(cache, idx, 0))

    def _update_buffers(self, update) -> None:
        """Apply ``update`` once per buffer and point every entry sharing it at the result."""
        for caches in (self.key_caches, self.value_caches):
            done: dict[int, mx.array] = {}
            for entry, t in enumerate(self.tensor_of):
                if t not in done:
                    done[t] = update(caches[entry])
                caches[entry] = done[t]
        mx.eval(self.key_caches, self.value_caches)


def _set_rows(cache: mx.array, idx: mx.array, rows) -> mx.array:
    cache[idx] = rows
    return cache
