"""Elementwise activations: on the CPU the extension's vectorized kernels, elsewhere
(Metal, other dtypes) MLX's own functions.

MLX's CPU backend computes exp, erf and tanh one element at a time: exact GELU over
a 1500 x 1536 activation (a Whisper encoder layer's MLP) took 80 ms here, more than
the layer's matrix products. The kernel is exact to float32's step (erf by
Abramowitz and Stegun 7.1.26, absolute error <= 1.5e-7).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.native import get_ops

_SILU, _GELU_APPROX, _GELU, _GELU_FAST = 0, 1, 2, 3


def silu(x: mx.array) -> mx.array:
    """x * sigmoid(x), as mlx.nn.silu."""
    return _activation(x, _SILU, nn.silu)


def gelu_approx(x: mx.array) -> mx.array:
    """GELU's tanh form, as mlx.nn.gelu_approx."""
    return _activation(x, _GELU_APPROX, nn.gelu_approx)


def gelu(x: mx.array) -> mx.array:
    """x / 2 * (1 + erf(x / sqrt(2))), as mlx.nn.gelu."""
    return _activation(x, _GELU, nn.gelu)


def gelu_fast_approx(x: mx.array) -> mx.array:
    """x * sigmoid(1.702 x) ("quick GELU"), as mlx.nn.gelu_fast_approx."""
    return _activation(x, _GELU_FAST, nn.gelu_fast_approx)


def _activation(x: mx.array, kind: int, mlx_fn: Callable[[mx.array], mx.array]) -> mx.array:
    if x.dtype != mx.float32 or mx.default_device() != mx.cpu:
        return mlx_fn(x)
    return get_ops().activation(x, kind, stream=mx.cpu)
