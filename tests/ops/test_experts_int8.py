"""expert_matmul with int8 activations: each pair's row is its expert's int8
quantized_matmul (the same kernel, so the same bits; quantized_matmul's own values
are checked against the float64 oracle in test_linear_q8.py), whatever else the call
holds, from MLX's layout or from tiles."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import cpu_isa, random_float
from tests.ops.test_experts import K, Experts, routing
from vllm_metal.ops import linear
from vllm_metal.ops.experts import expert_matmul


def int8_experts(ex: Experts, x, idx, *, tiled=False, bias=None):
    arrays = (ex.w, ex.scales, ex.biases)
    if tiled:
        arrays = linear.tile_quantized(*arrays)
    return expert_matmul(x, idx, *arrays, bits=ex.bits, group_size=ex.group_size, bias=bias,
                         int8_activations=True, tiled=tiled)


def one_expert(ex: Experts, row, e: int, bias=None):
    return linear.quantized_matmul(row, ex.w[e], ex.scales[e], ex.biases[e], bits=ex.bits,
                                   group_size=ex.group_size, int8_activations=True,
                                   bias=None if bias is None else bias[e])


def bits_of(a) -> np.ndarray:
    return np.array(a.astype(mx.float32)).view(np.uint32)


@pytest.mark.parametrize("isa", ["avx512", "generic"])
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 128), (8, 64)])
@pytest.mark.parametrize("tiled", [False, True])
def test_each_pair_is_its_experts_int8_product(isa, bits, group_size, tiled):
    ex = Experts(bits, group_size, dtype=mx.float16, seed=bits)  # N = 45: a partial tile
    x = random_float((11, K), seed=2)
    idx = routing(11, 2, seed=3)
    bias = random_float((ex.w.shape[0], ex.w.shape[1]), seed=4)
    with cpu_isa(isa):
        out = bits_of(int8_experts(ex, x, idx, tiled=tiled, bias=bias))
        pairs = np.array(idx)
        for p in range(pairs.size):
            want = bits_of(one_expert(ex, x[p // 2:p // 2 + 1], int(pairs[p]), bias))
            assert np.array_equal(out[p], want[0]), f"pair {p}"


@pytest.mark.parametrize("isa", ["avx512", "generic"])
def test_a_pair_gives_the_same_bits_alone_and_in_any_batch(isa):
    ex = Experts(4, 64, dtype=mx.bfloat16, seed=16)
    x = random_float((30, K), seed=17)
    idx = routing(30, 2, seed=18)
    with cpu_isa(isa):
        for tiled in (False, True):
            batch = bits_of(int8_experts(ex, x, idx, tiled=tiled))
            for t in (0, 13, 29):
                alone = bits_of(int8_experts(ex, x[t:t + 1], idx[2 * t:2 * t + 2], tiled=tiled))
                assert np.array_equal(alone, batch[2 * t:2 * t + 2]), f"token {t} alone"
            first = bits_of(int8_experts(ex, x[:7], idx[:14], tiled=tiled))
            assert np.array_equal(first, batch[:14])


def test_int8_needs_affine_experts_and_tiles_need_int8():
    x = random_float((2, K))
    idx = routing(2, 1)
    dense = Experts(0)
    with pytest.raises(ValueError, match="int8_activations"):
        expert_matmul(x, idx, dense.w, int8_activations=True)
    fp4 = Experts(4, mode="mxfp4")
    with pytest.raises(ValueError, match="int8_activations"):
        expert_matmul(x, idx, fp4.w, fp4.scales, None, bits=4, group_size=32, mode="mxfp4",
                      int8_activations=True)
    q = Experts(4, 64)
    tiles = linear.tile_quantized(q.w, q.scales, q.biases)
    with pytest.raises(ValueError, match="tiled"):
        expert_matmul(x, idx, *tiles, bits=4, group_size=64, tiled=True)
