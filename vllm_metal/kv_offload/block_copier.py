"""BlockCopier: vLLM's offloading worker for this platform: KV blocks to and from
the host region, as plain memory copies.

The KV pool and the host region are both host memory here (MLX's CPU backend, or
Apple silicon's unified memory), so a transfer is a gather and a scatter of rows;
there is no device stream to overlap with. Copies run when submitted: a store
needs the pool's bytes final, a load must land before the step that reads it,
and on two busy cores a copy thread would only take time from the forward.

A chunk of the host region holds ``blocks_per_chunk`` consecutive blocks of one
request: for each KV buffer in turn (every layer's K, then every V), that
buffer's rows of those blocks. A block of any KV cache group is the same row of
every buffer (groups share the buffers, a block id belonging to one group at a
time), so every group's chunk has this one layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from vllm.v1.kv_offload.base import (GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker,
                                     TransferResult)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_metal.kv_offload.host_region import HostRegion

# -> one uint8 [num_blocks, row_bytes] view per KV buffer, over the live pool.
PoolViews = Callable[[], Sequence[np.ndarray]]


def block_placement(group_sizes: Sequence[int], block_indices: Sequence[int],
                    chunk_ids: np.ndarray, blocks_per_chunk: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Where each pool block of a transfer sits in the host region.

    The pool blocks are listed group after group (``group_sizes``), group g's first
    being its request's block number ``block_indices[g]``; the chunks are listed the
    same way, a group's first chunk starting at that block's chunk boundary. ->
    (chunk id, slot within the chunk) per pool block, int64 [sum(group_sizes)].
    """
    chunks, slots = [], []
    first_chunk = 0
    for size, start in zip(group_sizes, block_indices):
        if size == 0:
            continue
        logical = start % blocks_per_chunk + np.arange(size)
        used = -(-(logical[-1] + 1) // blocks_per_chunk)
        group_chunks = chunk_ids[first_chunk:first_chunk + used]
        if len(group_chunks) != used:
            raise ValueError(f"transfer names {len(chunk_ids)} chunks; its blocks need more")
        chunks.append(group_chunks[logical // blocks_per_chunk])
        slots.append(logical % blocks_per_chunk)
        first_chunk += used
    if first_chunk != len(chunk_ids):
        raise ValueError(f"transfer names {len(chunk_ids)} chunks; its blocks use "
                         f"{first_chunk}")
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate(chunks).astype(np.int64),
            np.concatenate(slots).astype(np.int64))


class BlockCopier(OffloadingWorker):
    """Copies blocks between the KV pool (``pool_views``) and ``region``.

    ``settle`` returns once every queued computation has finished writing the
    pool, so a store reads final bytes and a load overwrites no block a step still
    writes (a block freed by an abort while its step ran).
    """

    def __init__(self, pool_views: PoolViews, region: HostRegion, blocks_per_chunk: int,
                 settle: Callable[[], None]) -> None:
        self._pool_views = pool_views
        self._region = region
        self._blocks_per_chunk = blocks_per_chunk
        self._settle = settle
        self._finished: list[TransferResult] = []
        row_bytes = sum(v.shape[1] for v in pool_views())
        if row_bytes * blocks_per_chunk > region.chunk_bytes:
            raise ValueError(f"a chunk of {blocks_per_chunk} blocks needs "
                             f"{row_bytes * blocks_per_chunk} bytes; the host region's "
                             f"chunks have {region.chunk_bytes}")

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        self._copy(job_id, src_spec, dst_spec, to_region=True)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        self._copy(job_id, dst_spec, src_spec, to_region=False)
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None  # every job finished when it was submitted

    def shutdown(self) -> None:
        self._region.cleanup()

    def _copy(self, job_id: int, pool: GPULoadStoreSpec, host: LoadStoreSpec,
              to_region: bool) -> None:
        assert isinstance(pool, GPULoadStoreSpec) and isinstance(host, CPULoadStoreSpec)
        start = time.perf_counter()
        chunks, slots = block_placement(pool.group_sizes, pool.block_indices,
                                        host.chunk_ids, self._blocks_per_chunk)
        blocks = pool.block_ids.astype(np.int64)
        if len(blocks) != len(chunks):
            raise ValueError(f"transfer {job_id}: {len(blocks)} pool blocks for "
                             f"{len(chunks)} placements")
        self._settle()
        rows = self._region.rows()
        offset = moved = 0
        for view in self._pool_views():
            width = view.shape[1]
            area = np.lib.stride_tricks.as_strided(
                rows[:, offset:], shape=(rows.shape[0], self._blocks_per_chunk, width),
                strides=(rows.strides[0], width, 1))
            if to_region:
                area[chunks, slots] = view[blocks]
            else:
                view[blocks] = area[chunks, slots]
            offset += width * self._blocks_per_chunk
            moved += width * len(blocks)
        self._finished.append(TransferResult(job_id, True, moved,
                                             time.perf_counter() - start))
