"""The LoRA ops as lazy MLX graph nodes (native kernels of ``vllm_metal._ext``).

A packed step's rows belong to different requests, and each request may use
its own adapter: ``lora_delta`` computes every row's low-rank update in the
step itself (no weights are merged per request), ``lora_apply`` adds it to the
base layer's output in the same pass. The adapters of one target module are
stacked in slots, ranks padded with zeros to the largest:

    lora_a [L, r, in], lora_b [L, r, out], scale [L] (alpha / rank per slot)

and ``idx [T]`` names each row's slot, -1 for no adapter. The CPU kernel groups
the rows by slot, so each adapter's A and B are read once per step (on the GPU
the caches serve the repeated reads); a row's result is the same bits
whichever rows share the step.

Both validate their arguments (ValueError/TypeError naming the bad one) and
return unevaluated arrays. An idx outside [-1, L) raises at evaluation on the
CPU; on the GPU it is checked when the op is built if idx is already evaluated
(else such a row gets no update). On macOS the ops run on the GPU through the
kernels_v2 Metal kernels once vllm_metal.native.get_ops() has loaded them, else
on the CPU stream. vllm_metal.ops.reference holds the pure-MLX versions
(``lora_delta_ref``, ``lora_apply_ref``).

A fused projection (qkv_proj, gate_up_proj) whose slices are separate target
modules takes one ``lora_apply`` per slice, each with its own stacks and
``column_offset``, chained on the base output: the result of each call is
the next one's y, whose buffer it reuses when nothing else holds it.
"""

from __future__ import annotations

from numbers import Integral

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["lora_apply", "lora_delta", "takes_dtypes"]

_FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
_INDEX_DTYPES = (mx.int32, mx.int64)


def lora_delta(x: mx.array, idx: mx.array, lora_a: mx.array, lora_b: mx.array, scale: mx.array, *,
               validate: bool = True) -> mx.array:
    """Each row's LoRA update.

    x:      [..., in] float16/bfloat16/float32; the leading dimensions are the T rows
    idx:    int32/int64 [T], each row's adapter slot in [-1, L); -1 = no adapter
    lora_a: [L, r, in], x's dtype (slots of lower rank padded with zeros); on the CPU,
            also bfloat16/float16 beside float32 x (read as fp32)
    lora_b: [L, r, out], lora_a's dtype (mlx-lm's layout, B transposed from PEFT's)
    scale:  float [L], each slot's alpha / rank (used as float32)
    Returns [..., out] in x's dtype: ``scale[a] * (lora_a[a] @ x[t]) @ lora_b[a]``
    for a = idx[t], zeros where idx is -1; accumulated in float32, rounded once.
    validate=False skips the Python checks (the extension still checks shapes and dtypes).
    """
    if validate:
        _check(x, idx, lora_a, lora_b, scale)
    return get_ops().lora_delta(x, idx, lora_a, lora_b, scale, stream=_stream())


def lora_apply(y: mx.array, x: mx.array, idx: mx.array, lora_a: mx.array, lora_b: mx.array,
               scale: mx.array, *, column_offset: int = 0, validate: bool = True) -> mx.array:
    """The base output y with each row's LoRA update added, in one pass.

    y:      [..., out_cols], x's dtype and leading dimensions: the base layer's output
    x, idx, lora_a, lora_b, scale: as ``lora_delta`` (lora_b [L, r, out])
    column_offset: the update goes to columns [column_offset, column_offset + out)
            of y: one slice of a fused projection
    Returns y's shape and dtype: ``y + update`` rounded once in those columns; rows
    with idx -1 and the other columns are y's own values.
    """
    if validate:
        _check(x, idx, lora_a, lora_b, scale)
        _float("y", y)
        if y.dtype != x.dtype:
            raise TypeError(f"y dtype {y.dtype} must equal x dtype {x.dtype}")
        if y.ndim != x.ndim or y.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"y must be [..., out_cols] with x's leading dimensions {x.shape[:-1]}, "
                             f"got {y.shape}")
        if not isinstance(column_offset, Integral) or isinstance(column_offset, bool):
            raise TypeError(f"column_offset must be an int, got {column_offset!r}")
        out = lora_b.shape[2]
        if column_offset < 0 or column_offset + out > y.shape[-1]:
            raise ValueError(f"the update's columns [{column_offset}, {column_offset + out}) must lie "
                             f"within y's {y.shape[-1]} columns")
    return get_ops().lora_apply(y, x, idx, lora_a, lora_b, scale, column_offset=int(column_offset),
                                stream=_stream())


def takes_dtypes(x_dtype: mx.Dtype, stack_dtype: mx.Dtype) -> bool:
    """Whether the ops take rows of X_DTYPE with stacks of STACK_DTYPE: one dtype, or
    on the CPU half-precision stacks beside float32 rows (read as fp32)."""
    return x_dtype == stack_dtype or (
        x_dtype == mx.float32 and stack_dtype in (mx.bfloat16, mx.float16)
        and not get_ops().metal_kernels_loaded())


def _check(x, idx, lora_a, lora_b, scale) -> None:
    _float("x", x)
    if x.ndim < 1:
        raise ValueError("x must be at least 1-D [..., in], got a scalar")
    rows = _rows(x)
    if not isinstance(idx, mx.array):
        raise TypeError(f"idx must be an mx.array, got {type(idx).__name__}")
    if idx.dtype not in _INDEX_DTYPES:
        raise TypeError(f"idx must be int32 or int64, got {idx.dtype}")
    if idx.shape != (rows,):
        raise ValueError(f"idx must be [T] = ({rows},) (x's rows), got {idx.shape}")
    _float("lora_a", lora_a)
    _float("lora_b", lora_b)
    if lora_a.ndim != 3:
        raise ValueError(f"lora_a must be 3-D [L, r, in], got shape {lora_a.shape}")
    if lora_b.ndim != 3:
        raise ValueError(f"lora_b must be 3-D [L, r, out], got shape {lora_b.shape}")
    slots, rank, k = lora_a.shape
    if k != x.shape[-1]:
        raise ValueError(f"lora_a [L, r, in] = {lora_a.shape} does not match x's in = {x.shape[-1]}")
    if lora_b.shape[0] != slots or lora_b.shape[1] != rank:
        raise ValueError(f"lora_b [L, r, out] = {lora_b.shape} does not match lora_a's L = {slots} "
                         f"and r = {rank}")
    if slots < 1 or rank < 1:
        raise ValueError(f"lora_a needs at least one slot (L >= 1) of rank r >= 1, got {lora_a.shape}")
    if lora_a.dtype != lora_b.dtype or not takes_dtypes(x.dtype, lora_a.dtype):
        for name, a in (("lora_a", lora_a), ("lora_b", lora_b)):
            if a.dtype != x.dtype:
                raise TypeError(f"{name} dtype {a.dtype} must equal x dtype {x.dtype} (on the "
                                f"CPU, bfloat16 or float16 both, beside float32 x)")
    _float("scale", scale)
    if scale.shape != (slots,):
        raise ValueError(f"scale must be [L] = ({slots},), got {scale.shape}")


def _rows(x: mx.array) -> int:
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows


def _float(name: str, a: object) -> None:
    if not isinstance(a, mx.array):
        raise TypeError(f"{name} must be an mx.array, got {type(a).__name__}")
    if a.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {a.dtype}")


def _stream() -> mx.DeviceType | None:
    # With the Metal kernels loaded the op runs on the default (GPU) stream;
    # without them, on the CPU stream (unified memory: no copies).
    return None if get_ops().metal_kernels_loaded() else mx.cpu
