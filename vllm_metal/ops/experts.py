"""The expert matmul of mixture-of-experts layers as a lazy MLX graph node
(CPU kernel of ``vllm_metal._ext``; vllm_metal.ops.reference.expert_matmul_ref
is the pure-MLX version).

The extension checks every shape and dtype (ValueError naming the argument);
an expert index outside [0, E) raises when the result is evaluated.
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["expert_matmul"]

_CPU = mx.cpu


def expert_matmul(x: mx.array, idx: mx.array, w: mx.array, scales: mx.array | None = None,
                  biases: mx.array | None = None, *, bits: int = 0, group_size: int = 0,
                  bias: mx.array | None = None, mode: str = "affine",
                  int8_activations: bool = False, tiled: bool = False) -> mx.array:
    """Each (token, expert) pair's row times its expert's matrix.

    x:      [R, K] float32/bfloat16/float16; R divides P, each row feeding P / R
            consecutive pairs (a token shared by its top-k experts, or one row a pair)
    idx:    integer [P], the expert of each pair, in [0, E)
    w:      float [E, N, K] (bits=0), or uint32 [E, N, K * bits / 32] (bits 4 or 8,
            MLX affine) with scales and biases [E, N, K / group_size]; or mode
            "mxfp4" (bits 4, group_size 32): FP4 codes with uint8 E8M0 scales
            [E, N, K / 32] and biases None
    bias:   optional float [E, N], each expert's bias
    Returns [P, N]: x[p // (P // R)] @ w[idx[p]].T (+ bias[idx[p]]), accumulated in
    float32, in MLX's promotion of the x, weight (scales) and bias dtypes.
    int8_activations (affine weights): x rounded to int8 per 32 columns, as
    ops.linear.quantized_matmul; a pair's row is the same bits whatever else the call
    holds. tiled (with int8_activations): w, scales and biases from
    ops.linear.tile_quantized (each expert tiled on its own).
    """
    if not isinstance(idx, mx.array):
        raise TypeError(f"idx must be an mx.array, got {type(idx).__name__}")
    if idx.dtype not in (mx.int32, mx.uint32):
        if not mx.issubdtype(idx.dtype, mx.integer):
            raise TypeError(f"idx must be an integer array, got {idx.dtype}")
        idx = idx.astype(mx.int32)
    return get_ops().expert_matmul(x, idx, w, scales, biases, bits, group_size, bias,
                                   mode=mode, int8_activations=int8_activations, tiled=tiled,
                                   stream=_CPU)
