"""The forward-time routing of mx.fast.rms_norm / mx.fast.rope to our CPU kernels."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from vllm_metal.cpu.fast_functions import fast_functions


def test_routes_inside_the_block_and_restores_after():
    mlx_rope, mlx_norm = mx.fast.rope, mx.fast.rms_norm
    with fast_functions():
        assert mx.fast.rope is not mlx_rope and mx.fast.rms_norm is not mlx_norm
    assert mx.fast.rope is mlx_rope and mx.fast.rms_norm is mlx_norm


def test_mlx_modules_give_the_same_result_through_our_kernels():
    # nn.RoPE with per-example offsets, traditional and not, and nn.RMSNorm.
    x = mx.random.normal((3, 4, 5, 64), key=mx.random.key(0))
    off = mx.array([0, 7, 300], dtype=mx.int32)
    for module in (nn.RoPE(64, traditional=False, base=10000.0),
                   nn.RoPE(32, traditional=True, base=500.0, scale=0.5)):
        want = module(x, offset=off)
        with fast_functions():
            got = module(x, offset=off)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    norm = nn.RMSNorm(64, eps=1e-6)
    norm.weight = mx.random.normal((64,), key=mx.random.key(1))
    want = norm(x)
    with fast_functions():
        got = norm(x)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_uncovered_calls_fall_back_to_mlx():
    # An explicit stream and a 2-D input are not ours: MLX computes them unchanged.
    x = mx.random.normal((4, 16), key=mx.random.key(2))
    with fast_functions():
        got = mx.fast.rms_norm(x, None, 1e-5, stream=mx.cpu)
        got_rope = mx.fast.rope(x[None], 16, traditional=False, base=1e4, scale=1.0, offset=2)
    np.testing.assert_allclose(np.array(got), np.array(mx.fast.rms_norm(x, None, 1e-5)))
    want = mx.fast.rope(x[None], 16, traditional=False, base=1e4, scale=1.0, offset=2)
    np.testing.assert_allclose(np.array(got_rope), np.array(want), rtol=1e-4, atol=1e-4)
