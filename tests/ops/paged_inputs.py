"""Random paged-attention batches for the op tests.

Everything that a correct kernel must never read is poisoned with NaN: cache
rows past each sequence's context, blocks no sequence owns, and the padding
entries of block_tables point at such a poisoned block. Any over-read turns
the output into NaN and fails the comparison.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

# Absolute tolerance per dtype for outputs of magnitude ~1 (the inputs are N(0, 1)):
# a few units in the last place of the output dtype.
TOLERANCE = {mx.float32: 2e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}


@dataclass
class PagedBatch:
    query: mx.array  # [total_q, num_heads, head_size]
    key_cache: mx.array  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: mx.array
    block_tables: mx.array  # int32 [num_seqs, max_blocks]
    seq_lens: mx.array  # int32 [num_seqs]
    cu_seqlens_q: mx.array  # int32 [num_seqs + 1]
    scale: float

    def args(self) -> tuple:
        return (self.query, self.key_cache, self.value_cache, self.block_tables,
                self.seq_lens, self.cu_seqlens_q, self.scale)


def make_batch(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_size: int = 64,
    block_size: int = 16,
    dtype: mx.Dtype = mx.float32,
    query_dtype: mx.Dtype | None = None,
    shuffle: bool = True,
    seed: int = 0,
) -> PagedBatch:
    """A batch where sequence i has seq_lens[i] tokens of context, q_lens[i] of them new."""
    assert len(seq_lens) == len(q_lens) and all(q <= s for s, q in zip(seq_lens, q_lens))
    rng = np.random.default_rng(seed)
    blocks_needed = [math.ceil(n / block_size) for n in seq_lens]
    spare = 2  # blocks owned by nobody, NaN-filled
    num_blocks = sum(blocks_needed) + spare
    permutation = rng.permutation(num_blocks)  # drawn always: same data either way
    ids = permutation if shuffle else np.arange(num_blocks)
    poison_block = int(ids[-1])

    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key = np.full(shape, np.nan, dtype=np.float32)
    value = np.full(shape, np.nan, dtype=np.float32)
    table = np.full((len(seq_lens), max(blocks_needed, default=0) + 1), poison_block, np.int32)
    next_id = 0
    for i, n in enumerate(seq_lens):
        for b in range(blocks_needed[i]):
            block = int(ids[next_id])
            next_id += 1
            table[i, b] = block
            rows = min(block_size, n - b * block_size)
            key[block, :rows] = rng.standard_normal((rows, num_kv_heads, head_size))
            value[block, :rows] = rng.standard_normal((rows, num_kv_heads, head_size))

    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    query = rng.standard_normal((int(cu[-1]), num_heads, head_size)).astype(np.float32)
    batch = PagedBatch(
        query=mx.array(query).astype(query_dtype or dtype),
        key_cache=mx.array(key).astype(dtype),
        value_cache=mx.array(value).astype(dtype),
        block_tables=mx.array(table),
        seq_lens=mx.array(np.array(seq_lens, dtype=np.int32)),
        cu_seqlens_q=mx.array(cu),
        scale=head_size**-0.5,
    )
    mx.eval(batch.query, batch.key_cache, batch.value_cache)
    return batch


def as_key_columns(batch: PagedBatch) -> PagedBatch:
    """The batch with its key cache stored as columns (ops.paged_attention's
    key_columns): the same keys, [num_blocks, num_kv_heads, head_size, block_size]."""
    from vllm_metal.ops.reference import rows_as_key_columns

    return PagedBatch(batch.query, rows_as_key_columns(batch.key_cache), *batch.args()[2:])


def as_numpy(x: mx.array) -> np.ndarray:
    """float64 (or int64) numpy copy of an MLX array, exact for every float dtype."""
    if mx.issubdtype(x.dtype, mx.floating):
        return np.array(x.astype(mx.float32)).astype(np.float64)
    return np.array(x).astype(np.int64)


def assert_close(actual: mx.array, expected, dtype: mx.Dtype) -> None:
    actual = as_numpy(actual)
    expected = expected if isinstance(expected, np.ndarray) else as_numpy(expected)
    assert actual.shape == expected.shape
    assert np.isfinite(actual).all(), "output has NaN/inf: the kernel read poisoned memory"
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype])


@contextlib.contextmanager
def forced(route: str, partition: int):
    """The CPU kernels take `route` (pieces of at most `partition` keys) for the duration."""
    from vllm_metal.native import get_ops

    ext = get_ops()
    ext.debug.force_paged_route(route, partition)
    try:
        yield
    finally:
        ext.debug.force_paged_route(None)
