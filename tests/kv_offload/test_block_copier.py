"""BlockCopier against a per-block reference of vLLM's transfer semantics
(vllm.v1.kv_offload.base.GPULoadStoreSpec): a group's blocks are its request's
blocks block_indices[g], block_indices[g] + 1, ...; host chunks hold
blocks_per_chunk consecutive request blocks, the group's first chunk starting at
the chunk boundary at or before block_indices[g]."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_metal.kv_offload.block_copier import BlockCopier, block_placement
from vllm_metal.kv_offload.host_region import HostRegion

ROW_BYTES = (48, 48, 80)  # three buffers of different widths (K, V, a latent)
NUM_BLOCKS = 20


def _pool(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(NUM_BLOCKS, w), dtype=np.uint8) for w in ROW_BYTES]


def _reference_placement(group_sizes, block_indices, chunk_ids, per_chunk):
    """(chunk, slot) per block, one block at a time."""
    out, first = [], 0
    for size, start in zip(group_sizes, block_indices):
        if size == 0:
            continue
        base = start - start % per_chunk  # request block number of the group's first chunk
        for i in range(size):
            n = start + i
            out.append((int(chunk_ids[first + (n - base) // per_chunk]), (n - base) % per_chunk))
        first += (start + size - 1 - base) // per_chunk + 1
    return out


@pytest.mark.parametrize("per_chunk", [1, 2, 4])
@pytest.mark.parametrize("group_sizes,block_indices", [
    ([5], [0]), ([5], [3]), ([3, 0, 4], [1, 7, 2]), ([1], [6]), ([2, 3], [4, 0])])
def test_placement_equals_the_per_block_reference(per_chunk, group_sizes, block_indices):
    needed = sum(-(-(s + b % per_chunk) // per_chunk) for s, b in zip(group_sizes, block_indices)
                 if s)
    chunk_ids = np.random.default_rng(1).permutation(50)[:needed]
    chunks, slots = block_placement(group_sizes, block_indices, chunk_ids, per_chunk)
    assert list(zip(chunks.tolist(), slots.tolist())) == _reference_placement(
        group_sizes, block_indices, chunk_ids, per_chunk)


def test_placement_refuses_a_chunk_count_that_does_not_fit():
    with pytest.raises(ValueError, match="chunks"):
        block_placement([4], [0], np.array([1]), 2)
    with pytest.raises(ValueError, match="chunks"):
        block_placement([2], [0], np.array([1, 2, 3]), 2)


def _copier(pool, per_chunk, engine="t", chunk_bytes=None):
    chunk_bytes = chunk_bytes or -(-sum(ROW_BYTES) * per_chunk // mmap.PAGESIZE) * mmap.PAGESIZE
    region = HostRegion.acquire(engine, 16, chunk_bytes)
    settled = []
    copier = BlockCopier(lambda: pool, region, per_chunk, lambda: settled.append(1))
    return copier, region, settled


@pytest.mark.parametrize("per_chunk", [1, 3])
def test_store_then_load_into_other_blocks_gives_back_the_bytes(per_chunk):
    pool = _pool(0)
    original = [p.copy() for p in pool]
    copier, region, settled = _copier(pool, per_chunk, engine=f"roundtrip{per_chunk}")
    try:
        group_sizes, block_indices = [4, 2], [2, 5]
        blocks = [3, 9, 4, 11, 7, 8]
        needed = sum(-(-(s + b % per_chunk) // per_chunk)
                     for s, b in zip(group_sizes, block_indices))
        chunks = list(range(10, 10 + needed))
        copier.submit_store(1, GPULoadStoreSpec(blocks, group_sizes, block_indices),
                            CPULoadStoreSpec(chunks))
        targets = [12, 13, 14, 15, 16, 17]
        copier.submit_load(2, CPULoadStoreSpec(chunks),
                           GPULoadStoreSpec(targets, group_sizes, block_indices))
        done = copier.get_finished()
        assert [r.job_id for r in done] == [1, 2] and all(r.success for r in done)
        assert done[0].transfer_size == sum(ROW_BYTES) * len(blocks)
        assert len(settled) == 2  # the device settled before each copy
        for buf, orig in zip(pool, original):
            np.testing.assert_array_equal(buf[targets], orig[blocks])
            untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
            np.testing.assert_array_equal(buf[untouched], orig[untouched])
        # The host bytes of a block: each buffer's row in turn, per_chunk rows per buffer.
        rows = region.rows()
        chunk, slot = _reference_placement(group_sizes, block_indices, chunks, per_chunk)[0]
        offset = 0
        for buf, orig in zip(pool, original):
            width = buf.shape[1]
            start = offset + slot * width
            np.testing.assert_array_equal(rows[chunk, start:start + width], orig[blocks[0]])
            offset += width * per_chunk
        assert copier.get_finished() == []
    finally:
        copier.shutdown()


def test_a_chunk_too_small_for_the_pool_rows_is_refused():
    with pytest.raises(ValueError, match="bytes"):
        _copier(_pool(0), 64, engine="small", chunk_bytes=mmap.PAGESIZE)


def test_region_is_shared_per_engine_and_released_by_the_last_user():
    a = HostRegion.acquire("shared", 4, mmap.PAGESIZE)
    b = HostRegion.acquire("shared", 4, mmap.PAGESIZE)
    assert a is b
    a.rows()[2, :3] = (1, 2, 3)
    view = b.create_kv_memoryview()
    assert view.strides[0] == mmap.PAGESIZE  # vLLM's tiers take the chunk size from it
    flat = view.cast("B")
    assert bytes(flat[2 * mmap.PAGESIZE:2 * mmap.PAGESIZE + 3]) == b"\x01\x02\x03"
    flat.release()
    view.release()
    with pytest.raises(RuntimeError, match="asked for"):
        HostRegion.acquire("shared", 8, mmap.PAGESIZE)
    a.cleanup()
    assert HostRegion.acquire("shared", 4, mmap.PAGESIZE) is b
    b.cleanup()
    b.cleanup()
    with pytest.raises(RuntimeError, match="released"):
        b.rows()
    c = HostRegion.acquire("shared", 4, mmap.PAGESIZE)
    assert c is not b and not c.rows().any()
    c.cleanup()
