"""RMS norm and rotary embedding as single CPU graph nodes (``vllm_metal._ext``).

They compute what ``mx.fast.rms_norm`` and ``mx.fast.rope`` compute. MLX's CPU
backend runs those as graphs of ~11 and ~28 small ops, which dominate a decode
step's node count; these are one node each, with the rotation angle formed in
double precision (exact at long-context positions). CPU kernels: they run on
the CPU stream. The CPU backend builds them in place of ``mx.fast``'s while a
forward is built (vllm_metal/cpu/fast_functions.py), with ``validate=False``: it
has decided the call is one the kernels cover, and the extension checks shapes
and dtypes itself.
"""

from __future__ import annotations

from numbers import Integral, Real

import mlx.core as mx

from vllm_metal.native import get_ops
from vllm_metal.ops.linear import _CPU, _array, _float_array

__all__ = ["rms_norm", "rope"]


def rms_norm(x: mx.array, weight: mx.array | None, eps: float, *,
             validate: bool = True) -> mx.array:
    """x [..., D] * rsqrt(mean(x^2, -1) + eps) * weight [D] (or no weight).

    Returns x's shape in MLX's promotion of x's and weight's dtypes.
    validate=False skips the Python checks (see the module docstring).
    """
    if validate:
        _check_rms_norm(x, weight, eps)
        eps = float(eps)
    return get_ops().rms_norm(x, weight, eps, stream=_CPU)


def _check_rms_norm(x, weight, eps) -> None:
    _float_array("x", x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    if weight is not None:
        _float_array("weight", weight)
        if weight.shape != (x.shape[-1],):
            raise ValueError(f"weight must be [D] = ({x.shape[-1]},), got {weight.shape}")
    if not isinstance(eps, Real) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")


def rope(x: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float,
         offset: int | mx.array, freqs: mx.array | None = None,
         validate: bool = True) -> mx.array:
    """Rotary embedding as ``mx.fast.rope``.

    x:      float [B, ..., L, D], at least 3-D
    offset: int, or integer array [] or [B]; element (b, ..., l) is at
            position offset[b] + l
    dims:   even, <= D; features past dims pass through
    base / freqs: exactly one; inv_freq[i] = base^(-2i/dims) or 1 / freqs[i], freqs [dims/2]
    Returns x's shape and dtype.
    validate=False skips the Python checks and conversions (see the module
    docstring): offset must then be as ``offset_array`` returns it.
    """
    if validate:
        _check_rope(x, dims, base, scale, freqs)
        offset = offset_array(offset, x.shape[0])
        dims, traditional, scale = int(dims), bool(traditional), float(scale)
        base = None if base is None else float(base)
    return get_ops().rope(x, dims, traditional=traditional, base=base, scale=scale,
                          offset=offset, freqs=freqs, stream=_CPU)


def _check_rope(x, dims, base, scale, freqs) -> None:
    _float_array("x", x)
    if x.ndim < 3:
        raise ValueError(f"x must be at least 3-D [B, ..., L, D], got shape {x.shape}")
    if not isinstance(dims, Integral) or isinstance(dims, bool):
        raise TypeError(f"dims must be an int, got {dims!r}")
    if dims <= 0 or dims % 2 or dims > x.shape[-1]:
        raise ValueError(f"dims must be even and in (0, {x.shape[-1]}], got {dims}")
    if (base is None) == (freqs is None):
        raise ValueError("give exactly one of base and freqs")
    if freqs is not None:
        _float_array("freqs", freqs)
        if freqs.shape != (dims // 2,):
            raise ValueError(f"freqs must be [dims / 2] = ({dims // 2},), got {freqs.shape}")
    if not isinstance(scale, Real) or isinstance(scale, bool):
        raise TypeError(f"scale must be a float, got {scale!r}")


def offset_array(offset: object, batch: int) -> mx.array:
    """offset as the kernel takes it: an int32 scalar array, or an integer array [] / [B]."""
    if isinstance(offset, Integral) and not isinstance(offset, bool):
        return mx.array(int(offset), dtype=mx.int32)
    _array("offset", offset)
    if not mx.issubdtype(offset.dtype, mx.integer):
        raise TypeError(f"offset must be an int or an integer array, got {offset.dtype}")
    if offset.ndim > 1 or (offset.ndim == 1 and offset.size not in (1, batch)):
        raise ValueError(f"offset must be a scalar or [B] = ({batch},), got {offset.shape}")
    return offset
