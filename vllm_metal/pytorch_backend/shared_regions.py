"""MLX-owned memory that was exported to torch, so torch views of it can come back without a copy.

MLX's CPU allocator cannot adopt foreign memory (`mx.from_dlpack(..., copy=False)`
raises for every CPU tensor on Linux), so the one zero-copy torch -> MLX path is
memory MLX allocated in the first place. Each export is recorded under its torch
storage; the record dies with the storage (all views gone).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass

import mlx.core as mx
import torch

from vllm_metal.pytorch_backend.dtypes import TORCH_TO_MLX_DTYPE


@dataclass(frozen=True)
class _Region:
    start: int  # address of array's first byte
    nbytes: int
    array: mx.array  # evaluated, row-contiguous


_regions: dict[int, dict[int, _Region]] = {}  # storage data_ptr -> {token: region}
_tokens = itertools.count()
_lock = threading.Lock()


def remember_export(tensor: torch.Tensor, array: mx.array) -> None:
    """Record that `tensor` (fresh from DLPack) views the row-contiguous `array`."""
    if array.nbytes == 0:
        return
    storage = tensor.untyped_storage()
    key, token = storage.data_ptr(), next(_tokens)
    with _lock:
        _regions.setdefault(key, {})[token] = _Region(tensor.data_ptr(), array.nbytes, array)
    # torch keeps one Python object per storage alive as long as any view is, so this
    # fires when the last view of the exported memory is gone.
    weakref.finalize(storage, _forget, key, token)


def recall_view(tensor: torch.Tensor) -> mx.array | None:
    """An MLX array aliasing `tensor`'s elements, or None if MLX does not own them.

    `tensor` must already be checked: CPU, strided layout, bridge dtype, strides >= 0.
    """
    with _lock:
        regions = list(_regions.get(tensor.untyped_storage().data_ptr(), {}).values())
    if not regions:
        return None
    itemsize = tensor.element_size()
    lo = tensor.data_ptr()
    span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    hi = lo + span * itemsize
    for r in regions:
        inside = r.start <= lo and hi <= r.start + r.nbytes
        if inside and (lo - r.start) % itemsize == 0 and r.nbytes % itemsize == 0:
            flat = r.array.reshape(-1)
            dtype = TORCH_TO_MLX_DTYPE[tensor.dtype]
            if flat.dtype != dtype:
                flat = mx.view(flat, dtype)  # reinterpret bytes, as torch's .view(dtype) did
            out = mx.as_strided(
                flat, tuple(tensor.shape), tuple(tensor.stride()), (lo - r.start) // itemsize
            )
            mx.eval(out)
            return out
    return None


def _forget(key: int, token: int) -> None:
    with _lock:
        regions = _regions.get(key)
        if regions is not None:
            regions.pop(token, None)
            if not regions:
                del _regions[key]


def live_region_count() -> int:
    """Number of exports still recorded (for tests and leak checks)."""
    with _lock:
        return sum(len(r) for r in _regions.values())
