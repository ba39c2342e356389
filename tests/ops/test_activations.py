"""vllm_metal.ops.activations on the CPU against numpy float64 (math.erf, tanh):
every element within float32's reach, small (one thread) and large (split over the
pool) arrays, a transposed view, and MLX's own functions for other dtypes."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from vllm_metal.ops import activations

_ERF = np.vectorize(math.erf)


def _reference(kind: str, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    if kind == "gelu_fast_approx":
        return x / (1.0 + np.exp(-1.702 * x))
    if kind == "gelu_approx":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))


@pytest.mark.parametrize("kind", ["silu", "gelu_approx", "gelu", "gelu_fast_approx"])
@pytest.mark.parametrize("shape", [(7,), (3, 129), (300, 1536)])
def test_matches_float64(kind, shape):
    rng = np.random.default_rng(len(shape))
    x = (rng.normal(size=shape) * 4.0).astype(np.float32)
    x.flat[:4] = [0.0, -30.0, 30.0, -1e-30][: min(4, x.size)]
    got = np.array(getattr(activations, kind)(mx.array(x)))
    np.testing.assert_allclose(got, _reference(kind, x), rtol=2e-6, atol=2e-6)


def test_a_transposed_view_and_mlx_agree():
    x = mx.array(np.random.default_rng(1).normal(size=(64, 96)).astype(np.float32)).T
    np.testing.assert_allclose(np.array(activations.gelu(x)), np.array(nn.gelu(x)),
                               rtol=1e-6, atol=1e-6)


def test_other_dtypes_take_mlx_functions():
    x = mx.array(np.linspace(-3, 3, 50), dtype=mx.bfloat16)
    assert mx.array_equal(activations.gelu(x), nn.gelu(x))
