"""The int8 kernels' tile order (ops.linear.tile_quantized) and their batch
invariance: a row of x gives the same bits alone, in any batch and in any order,
from MLX's layout or from tiles (csrc/cpu/linear/linear_q8.h). The values
themselves are checked against the float64 oracle in test_linear_q8.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import cpu_isa, make_quantized, random_float
from vllm_metal.ops import linear

ISAS = ["avx512", "generic"]


def product(x, q, *, tiled, symmetric=False, **kw):
    w, scales, biases = q.args()
    if symmetric:
        # Biases of -2^(bits-1) * scale, formed by the kernel (GGUF's Q4_0 / Q8_0).
        biases, zero_point = None, 2 ** (q.bits - 1)
        kw["zero_point"] = zero_point
    if tiled:
        w, scales, biases = linear.tile_quantized(w, scales, biases)
    return linear.quantized_matmul(x, w, scales, biases, bits=q.bits, group_size=q.group_size,
                                   int8_activations=True, tiled=tiled, **kw)


def bits_of(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).view(np.uint32)


@pytest.mark.parametrize("n", [1, 7, 16, 33, 48, 50])
def test_the_tile_order_places_each_element_and_round_trips(n):
    a = mx.arange(n * 5, dtype=mx.uint32).reshape(n, 5)
    tiled, = linear.tile_quantized(a)
    assert tiled.shape == a.shape
    flat = np.array(tiled).reshape(-1)
    for r in range(n):
        r0 = r // 16 * 16
        h = min(16, n - r0)
        for j in range(5):
            assert flat[r0 * 5 + j * h + (r - r0)] == r * 5 + j
    back, = linear.untile_quantized(tiled)
    assert np.array_equal(np.array(back), np.array(a))
    assert linear.tile_quantized(None) == (None,)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_tiles_give_the_bits_of_mlx_layout(isa, bits, group_size, scale_dtype):
    # 200 rows: whole tiles and a partial one (8 rows); K off the 128-column chunk grid.
    q = make_quantized(200, 384, bits, group_size, scale_dtype, seed=bits + group_size)
    x = random_float((13, 384), seed=3)
    with cpu_isa(isa):
        for m in (1, 4, 5, 13):
            want = bits_of(product(x[:m], q, tiled=False))
            assert np.array_equal(bits_of(product(x[:m], q, tiled=True)), want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_a_row_gives_the_same_bits_alone_and_in_any_batch(isa, bits, tiled, symmetric):
    q = make_quantized(72, 576, bits, 32, mx.float16, seed=bits)
    x = random_float((40, 576), seed=5)
    perm = np.random.default_rng(0).permutation(40)
    with cpu_isa(isa):
        full = bits_of(product(x, q, tiled=tiled, symmetric=symmetric))
        for i in (0, 7, 39):
            alone = bits_of(product(x[i:i + 1], q, tiled=tiled, symmetric=symmetric))
            assert np.array_equal(alone[0], full[i]), f"row {i} alone"
        for m in (2, 3, 4, 5, 8, 9, 12, 17, 33):
            part = bits_of(product(x[:m], q, tiled=tiled, symmetric=symmetric))
            assert np.array_equal(part, full[:m]), f"first {m} rows"
        shuffled = bits_of(product(x[mx.array(perm)], q, tiled=tiled, symmetric=symmetric))
        assert np.array_equal(shuffled, full[perm])


@pytest.mark.parametrize("isa", ISAS)
def test_greedy_heads_from_tiles_pick_mlx_layouts_columns(isa):
    q = make_quantized(1000, 256, 4, 64, mx.float16, seed=9)
    x = random_float((6, 256), seed=2)
    with cpu_isa(isa):
        want = product(x, q, tiled=False, argmax_columns=990)
        got = product(x, q, tiled=True, argmax_columns=990)
        alone = product(x[4:5], q, tiled=True, argmax_columns=990)
    assert np.array_equal(np.array(got), np.array(want))
    assert int(alone[0]) == int(want[4])


@pytest.mark.parametrize("bits", [4, 8])
def test_embedding_rows_from_tiles(bits):
    q = make_quantized(50, 128, bits, 32, mx.bfloat16, seed=4)
    ids = mx.array([0, 15, 16, 47, 48, 49, 3])
    want = linear.embedding_gather(ids, *q.args(), bits=bits, group_size=32)
    tiles = linear.tile_quantized(*q.args())
    got = linear.embedding_gather(ids, *tiles, bits=bits, group_size=32, tiled=True)
    assert np.array_equal(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)))


def test_rows_cut_at_a_tile_boundary_stay_tiles():
    q = make_quantized(80, 128, 4, 32, mx.float16, seed=6)
    x = random_float((3, 128), seed=1)
    tiles = linear.tile_quantized(*q.args())
    cut = [a[16:48] for a in tiles]
    got = linear.quantized_matmul(x, *cut, bits=4, group_size=32, int8_activations=True,
                                  tiled=True)
    whole = product(x, q, tiled=False)
    assert np.array_equal(bits_of(got), bits_of(whole)[:, 16:48])


def test_tiles_need_int8_activations():
    q = make_quantized(32, 64, 4, 32)
    x = random_float((2, 64))
    tiles = linear.tile_quantized(*q.args())
    with pytest.raises(ValueError, match="int8_activations"):
        linear.quantized_matmul(x, *tiles, bits=4, group_size=32, tiled=True)
    # Unchecked in Python, the extension refuses it too.
    with pytest.raises(ValueError, match="int8_activations"):
        linear.quantized_matmul(x, *tiles, bits=4, group_size=32, tiled=True, validate=False)
    with pytest.raises(ValueError, match="tiled"):
        linear.embedding_gather(mx.array([0]), random_float((4, 8)), tiled=True)
