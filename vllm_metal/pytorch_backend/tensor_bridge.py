"""torch <-> MLX at the vLLM boundary: shared memory where possible, copies only on request.

Measured with mlx 0.32.4 and torch 2.13 on the Linux CPU backend:
- MLX -> torch: `torch.from_dlpack(evaluated mx.array)` aliases MLX's buffer (all
  bridge dtypes, bfloat16 included; positive and zero strides kept). A negative
  stride (`a[::-1]`) aborts the torch process, so it is rejected before export.
- torch -> MLX: `mx.array(t)`, `mx.array(memoryview)` and `mx.from_dlpack(t)` all
  copy; `copy=False` raises because MLX's CPU allocator cannot wrap foreign memory.
  Zero-copy works only for tensors that view MLX-owned memory (exported by
  `mlx_to_torch`), and on Apple silicon where Metal may adopt page-aligned memory.
A torch write into shared memory is seen by MLX ops evaluated after it (arrays
evaluated before keep their values). MLX ops never write into an exported buffer:
the DLPack capsule holds a reference, so MLX cannot donate it to an output.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import torch

from vllm_metal.pytorch_backend.dtypes import (
    MLX_TO_TORCH_DTYPE,
    TORCH_TO_MLX_DTYPE,
    mlx_dtype_from_torch,
    torch_dtype_from_mlx,
)
from vllm_metal.pytorch_backend.shared_regions import recall_view, remember_export

__all__ = [
    "MLX_TO_TORCH_DTYPE",
    "TORCH_TO_MLX_DTYPE",
    "mlx_dtype_from_torch",
    "mlx_to_torch",
    "torch_dtype_from_mlx",
    "torch_to_mlx",
]

_DLPACK_CPU = 1


def mlx_to_torch(a: mx.array, *, copy: bool = False) -> torch.Tensor:
    """A CPU torch tensor with `a`'s shape, strides and values; shares `a`'s memory.

    copy=True returns a tensor with its own memory instead (and accepts negative strides).
    Raises TypeError for a non-array or an unmapped dtype, ValueError for negative strides.
    """
    if not isinstance(a, mx.array):
        raise TypeError(f"mlx_to_torch expects an mlx.core.array, got {type(a).__name__}")
    torch_dtype_from_mlx(a.dtype)  # raises TypeError naming an unmapped dtype
    mx.eval(a)  # export needs a materialized buffer
    view = memoryview(a)
    if any(s < 0 for s in view.strides):
        if not copy:
            raise ValueError(
                f"mlx_to_torch: array has negative strides {view.strides} (a reversed "
                "slice); torch cannot view it. Pass copy=True or use mx.contiguous(a)."
            )
        a = mx.contiguous(a)
        mx.eval(a)
        view = memoryview(a)
    t = _export(a)
    if copy:
        return t.clone()
    if view.c_contiguous:
        remember_export(t, a)
    return t


def torch_to_mlx(t: torch.Tensor, *, copy: bool = False) -> mx.array:
    """An mx.array with `t`'s shape and values.

    copy=False (default) shares `t`'s memory or raises ValueError saying why it cannot
    (on Linux: any tensor whose memory torch allocated). copy=True always copies.
    Raises TypeError for a non-tensor or an unmapped dtype, ValueError for a non-CPU
    device, a non-strided layout or negative strides.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch_to_mlx expects a torch.Tensor, got {type(t).__name__}")
    dtype = mlx_dtype_from_torch(t.dtype)
    if t.device.type != "cpu":
        raise ValueError(f"torch_to_mlx needs a CPU tensor, got device {t.device}")
    if t.layout != torch.strided:
        raise ValueError(f"torch_to_mlx needs a strided (dense) tensor, got layout {t.layout}")
    if any(s < 0 for s in t.stride()):
        raise ValueError(f"torch_to_mlx cannot share negative strides {t.stride()}")
    t = t.detach()  # same memory; DLPack refuses tensors that require grad
    if copy:
        out = mx.from_dlpack(t, copy=True)
        mx.eval(out)
        return out
    if t.numel() == 0:
        return mx.zeros(tuple(t.shape), dtype=dtype)  # no elements, nothing to alias
    shared = recall_view(t)
    if shared is None:
        shared = _adopt(t)
    if shared is None:
        raise ValueError(
            "torch_to_mlx: MLX cannot adopt this tensor's memory without a copy (MLX's "
            "CPU allocator does not wrap foreign buffers). Pass copy=True, or allocate "
            "the buffer in MLX and share it with mlx_to_torch()."
        )
    return shared


def _export(a: mx.array) -> torch.Tensor:
    """Zero-copy view of evaluated `a` with non-negative strides."""
    if a.__dlpack_device__()[0] == _DLPACK_CPU:
        return torch.from_dlpack(a)
    return _export_via_buffer(a)


def _export_via_buffer(a: mx.array) -> torch.Tensor:
    """Buffer-protocol export, for devices torch's DLPack import does not map (Metal).

    numpy has no bfloat16: its bits travel as uint16 and are reinterpreted by torch.
    """
    if a.dtype == mx.bfloat16:
        bits = mx.view(a, mx.uint16)
        mx.eval(bits)
        return torch.from_numpy(np.asarray(bits)).view(torch.bfloat16)
    return torch.from_numpy(np.asarray(a))


def _adopt(t: torch.Tensor) -> mx.array | None:
    """MLX adopting torch's memory in place; possible with Metal, never on the CPU backend."""
    try:
        out = mx.from_dlpack(t, copy=False)
    except ValueError:
        return None
    mx.eval(out)
    return out
