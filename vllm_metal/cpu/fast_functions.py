"""Route ``mx.fast.rms_norm`` and ``mx.fast.rope`` to single-node CPU kernels
while a forward graph is being built.

On MLX's CPU backend those two functions expand into ~11 and ~28 graph nodes;
a 30-layer decode step spent most of its ~3200 nodes on them. mlx-lm models
call them through ``mx.fast`` at call time, from many module classes (plain,
llama3, yarn, ... RoPE; RMSNorm and q/k norms), so swapping the two functions
for the duration of the forward covers every model without knowing its
classes. Calls the kernels do not cover (other dtypes, shapes, an explicit
stream) go to MLX's own functions unchanged; the rest go to
vllm_metal.ops.norm_rope with validate=False (the checks here decided them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import mlx.core as mx

from vllm_metal.ops import norm_rope

_FLOATS = (mx.float32, mx.bfloat16, mx.float16)
_MLX_RMS_NORM = mx.fast.rms_norm
_MLX_ROPE = mx.fast.rope


def _rms_norm(x, weight, eps, *, stream=None):
    if (stream is None and x.dtype in _FLOATS and x.ndim >= 1 and x.shape[-1] > 0
            and (weight is None or (weight.dtype in _FLOATS and weight.shape == x.shape[-1:]))):
        return norm_rope.rms_norm(x, weight, eps, validate=False)
    return _MLX_RMS_NORM(x, weight, eps, stream=stream)


def _rope(a, dims, *, traditional, base, scale, offset, freqs=None, stream=None):
    if (stream is None and a.dtype in _FLOATS and a.ndim >= 3 and dims > 0 and dims % 2 == 0
            and dims <= a.shape[-1] and (base is None) != (freqs is None)
            and (freqs is None or (freqs.dtype in _FLOATS and freqs.shape == (dims // 2,)))):
        off = _offset(offset, a.shape[0])
        if off is not None:
            return norm_rope.rope(a, dims, traditional=traditional, base=base, scale=scale,
                                  offset=off, freqs=freqs, validate=False)
    return _MLX_ROPE(a, dims, traditional=traditional, base=base, scale=scale, offset=offset,
                     freqs=freqs, stream=stream)


def _offset(offset, batch: int) -> mx.array | None:
    try:
        return norm_rope.offset_array(offset, batch)
    except (TypeError, ValueError):   # not ours: MLX's own rope takes or rejects it
        return None


@contextlib.contextmanager
def fast_functions() -> Iterator[None]:
    """Within the block, mx.fast.rms_norm / mx.fast.rope build our CPU nodes.

    For graph building on the CPU backend; not re-entrant across threads: one
    model forward is built at a time.
    """
    fast = mx.fast
    fast.rms_norm, fast.rope = _rms_norm, _rope
    try:
        yield
    finally:
        fast.rms_norm, fast.rope = _MLX_RMS_NORM, _MLX_ROPE
