"""The one torch <-> MLX dtype map, shared by the tensor bridge, KV allocation and loading."""

from __future__ import annotations

import mlx.core as mx
import torch

# float64 is absent on purpose: MLX's GPU backend has no float64 and mx.from_dlpack
# narrows it to float32, so it cannot round-trip exactly.
TORCH_TO_MLX_DTYPE: dict[torch.dtype, mx.Dtype] = {
    torch.float32: mx.float32,
    torch.float16: mx.float16,
    torch.bfloat16: mx.bfloat16,
    torch.int8: mx.int8,
    torch.int16: mx.int16,
    torch.int32: mx.int32,
    torch.int64: mx.int64,
    torch.uint8: mx.uint8,
    torch.uint16: mx.uint16,
    torch.uint32: mx.uint32,
    torch.uint64: mx.uint64,
    torch.bool: mx.bool_,
}

MLX_TO_TORCH_DTYPE: dict[mx.Dtype, torch.dtype] = {m: t for t, m in TORCH_TO_MLX_DTYPE.items()}


def mlx_dtype_from_torch(dtype: torch.dtype) -> mx.Dtype:
    """MLX dtype for a torch dtype; TypeError names the dtype if it has no MLX twin."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}: {dtype!r}")
    try:
        return TORCH_TO_MLX_DTYPE[dtype]
    except KeyError:
        raise TypeError(
            f"torch dtype {dtype} has no MLX equivalent in the bridge; supported: "
            f"{sorted(str(d) for d in TORCH_TO_MLX_DTYPE)}"
        ) from None


def torch_dtype_from_mlx(dtype: mx.Dtype) -> torch.dtype:
    """torch dtype for an MLX dtype; TypeError names the dtype if it has no torch twin."""
    if not isinstance(dtype, mx.Dtype):
        raise TypeError(f"dtype must be an mlx.core.Dtype, got {type(dtype).__name__}: {dtype!r}")
    try:
        return MLX_TO_TORCH_DTYPE[dtype]
    except KeyError:
        raise TypeError(
            f"MLX dtype {dtype} has no torch equivalent in the bridge; supported: "
            f"{sorted(str(d) for d in MLX_TO_TORCH_DTYPE)}"
        ) from None
