"""The paged KV cache: one K and one V array per layer, shared with the kernels
(or, for multi-head latent attention, one latent array per layer)."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from vllm_metal.attention.kv_quant import STORAGE_DTYPE, KvQuant
from vllm_metal.ops import KEY_COLUMN_HEAD_SIZES


class PagedKVCache:
    """Per KV entry (layer) K and V of shape [num_blocks, block_size, num_kv_heads, head_dim]
    (K as key columns where ``key_columns``, below).

    Block ids come from vLLM's block manager; block 0 is its null block. With
    vLLM's hybrid cache, entries of different KV cache groups share one buffer
    (``tensor_of``): a block id belongs to one group at a time, so their rows
    never meet; ``groups`` says which block table each entry reads.

    ``latent``: multi-head latent attention (vLLM's MLA layout): each entry keeps
    one array of rows [latent, k_pe] (num_kv_heads 1, head_dim rank + rope_dim)
    in ``key_caches``, and ``value_caches`` holds None.

    ``quant``: a quantized format (attention.kv_quant): K and V are uint8
    [num_blocks, block_size, num_kv_heads, quant.key_width / value_width], each
    row its codes and what decodes them; ``dtype`` is then uint8.

    ``key_columns``: the backend's attention reads key columns (Backend.key_columns).
    Float caches at the head sizes the op takes them for then hold K as
    [num_blocks, num_kv_heads, head_dim, block_size] (the same bytes per block;
    ``self.key_columns`` says whether this cache does); the others keep rows.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: mx.Dtype, *,
                 tensor_of: Sequence[int] | None = None,
                 groups: Sequence[int] | None = None, latent: bool = False,
                 quant: KvQuant | None = None, key_columns: bool = False) -> None:
        if quant is not None and latent:
            raise ValueError("a latent (MLA) cache cannot be quantized")
        shape = (num_blocks, block_size, num_kv_heads,
                 head_dim if quant is None else quant.key_width(head_dim))
        value_shape = (*shape[:3], head_dim if quant is None else quant.value_width(head_dim))
        self.key_columns = (key_columns and quant is None and not latent
                            and head_dim in KEY_COLUMN_HEAD_SIZES)
        if self.key_columns:
            shape = (num_blocks, num_kv_heads, head_dim, block_size)
        dtype = dtype if quant is None else STORAGE_DTYPE
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.quant = quant
        self.tensor_of = list(range(num_layers)) if tensor_of is None else list(tensor_of)
        self.groups = None if groups is None else list(groups)
        self.latent = latent
        keys = {t: mx.zeros(shape, dtype=dtype) for t in sorted(set(self.tensor_of))}
        self.key_caches = [keys[t] for t in self.tensor_of]
        if latent:
            self.value_caches: list[mx.array | None] = [None] * len(self.tensor_of)
        else:
            values = {t: mx.zeros(value_shape, dtype=dtype) for t in keys}
            self.value_caches = [values[t] for t in self.tensor_of]
        mx.eval(self._lists())

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int,
                        head_dim: int, dtype: mx.Dtype, latent: bool = False,
                        quant: KvQuant | None = None) -> int:
        if quant is not None:
            rows = (quant.key_width(head_dim) + quant.value_width(head_dim)) * STORAGE_DTYPE.size
        else:
            rows = (1 if latent else 2) * head_dim * dtype.size
        return num_layers * block_size * num_kv_heads * rows

    def _lists(self) -> list[list[mx.array]]:
        return [self.key_caches] if self.latent else [self.key_caches, self.value_caches]

    def buffers(self) -> list[mx.array]:
        """Each distinct K and V (or latent) buffer once."""
        first = {}
        for entry, t in enumerate(self.tensor_of):
            first.setdefault(t, entry)
        return [caches[e] for caches in self._lists() for e in first.values()]

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
        for caches in self._lists():
            done: dict[int, mx.array] = {}
            for entry, t in enumerate(self.tensor_of):
                if t not in done:
                    done[t] = update(caches[entry])
                caches[entry] = done[t]
        mx.eval(self._lists())


def _set_rows(cache: mx.array, idx: mx.array, rows) -> mx.array:
    cache[idx] = rows
    return cache
