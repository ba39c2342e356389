"""HostRegion: the host tier's memory, one anonymous mapping per engine.

vLLM's CPU tier maps a file under /dev/shm so a scheduler and workers in other
processes share it; macOS has no /dev/shm, and on this platform the scheduler and
the one worker live in the engine core process (world size 1, the uniprocess
executor: config checks refuse the rest). So the region is anonymous memory that
both sides of one engine look up by its engine id.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

_LOCK = threading.Lock()
_REGIONS: dict[str, HostRegion] = {}


class HostRegion:
    """``num_chunks`` rows of ``chunk_bytes`` (a multiple of the page size) bytes.

    ``acquire`` hands the same region to every caller with one engine id until the
    last ``cleanup`` unmaps it; a second acquire with other sizes is an error.
    """

    def __init__(self, engine_id: str, num_chunks: int, chunk_bytes: int) -> None:
        if chunk_bytes % mmap.PAGESIZE:
            raise ValueError(f"chunk_bytes {chunk_bytes} is not a multiple of the page size "
                             f"{mmap.PAGESIZE}")
        self.engine_id = engine_id
        self.num_chunks = num_chunks
        self.chunk_bytes = chunk_bytes
        # An anonymous mapping is page-aligned (the disk tier's O_DIRECT I/O needs
        # that) and its pages are committed only when first written.
        self._map: mmap.mmap | None = mmap.mmap(-1, max(num_chunks * chunk_bytes, 1))
        self._users = 0

    @classmethod
    def acquire(cls, engine_id: str, num_chunks: int, chunk_bytes: int) -> HostRegion:
        with _LOCK:
            region = _REGIONS.get(engine_id)
            if region is None:
                region = _REGIONS[engine_id] = cls(engine_id, num_chunks, chunk_bytes)
            elif (region.num_chunks, region.chunk_bytes) != (num_chunks, chunk_bytes):
                raise RuntimeError(
                    f"KV offload region of engine {engine_id} is {region.num_chunks} chunks "
                    f"of {region.chunk_bytes} bytes; asked for {num_chunks} of {chunk_bytes}")
            region._users += 1
            return region

    def rows(self) -> np.ndarray:
        """uint8 [num_chunks, chunk_bytes] over the mapping (no copy)."""
        if self._map is None:
            raise RuntimeError(f"KV offload region of engine {self.engine_id} was released")
        flat = np.frombuffer(self._map, dtype=np.uint8)
        return flat[:self.num_chunks * self.chunk_bytes].reshape(self.num_chunks,
                                                                 self.chunk_bytes)

    def create_kv_memoryview(self) -> memoryview:
        """The rows as a memoryview: vLLM's secondary tiers address chunk c as view[c]."""
        return memoryview(self.rows())

    def cleanup(self) -> None:
        """Drop one user; the last one unmaps the region."""
        with _LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if _REGIONS.get(self.engine_id) is self:
                del _REGIONS[self.engine_id]
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # A view is still exported (a tier thread mid-copy); the mapping
                # goes when the last view does.
                pass
            self._map = None
