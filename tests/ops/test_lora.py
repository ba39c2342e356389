"""lora_delta / lora_apply (CPU kernels) against a numpy float64 oracle: dtypes,
ranks, row counts, mixed adapters, fused-projection slices; a row's result is
the same bits alone or in any batch, and across runs."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from tests.ops.lora_inputs import (FLOATS, as_f64, assert_close, bits, delta64, make_adapters,
                                   mixed_idx, random_float)
from vllm_metal.native import get_ops
from vllm_metal.ops import lora
from vllm_metal.ops.reference import lora_apply_ref, lora_delta_ref

# in / out not multiples of any SIMD width (8, 16): every tile has a masked tail.
K, N = 100, 77


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("rank", [1, 8, 16, 64])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_update_matches_float64(dtype, rank, rows):
    ad = make_adapters(4, rank, K, N, dtype, seed=rank)
    x = random_float((rows, K), dtype, seed=rows)
    idx = mixed_idx(rows, 4, seed=rows + rank)
    out = lora.lora_delta(x, idx, *ad.args())
    assert out.dtype == dtype and out.shape == (rows, N)
    assert_close(out, *delta64(x, idx, ad), dtype)
    assert_close(lora_delta_ref(x, idx, *ad.args()), *delta64(x, idx, ad), dtype)


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_apply_adds_to_its_columns_only(dtype, rows):
    ad = make_adapters(3, 16, K, N, dtype, seed=1)
    x = random_float((rows, K), dtype, seed=2)
    y = random_float((rows, 200), dtype, seed=3)
    idx = mixed_idx(rows, 3, seed=4)
    out = lora.lora_apply(y, x, idx, *ad.args(), column_offset=60)
    update, magnitude = delta64(x, idx, ad)
    expected = as_f64(y)
    expected[:, 60:60 + N] += update
    full_mag = np.zeros_like(expected)
    full_mag[:, 60:60 + N] = magnitude + np.abs(as_f64(y)[:, 60:60 + N])
    assert out.dtype == dtype and out.shape == y.shape
    assert_close(out, expected, full_mag, dtype)
    # Outside the slice, and in rows without an adapter, y's own bits.
    keep = np.ones(y.shape, bool)
    keep[np.array(idx) >= 0, 60:60 + N] = False
    np.testing.assert_array_equal(np.array(out.astype(mx.float32))[keep], np.array(y.astype(mx.float32))[keep])
    assert_close(lora_apply_ref(y, x, idx, *ad.args(), 60), expected, full_mag, dtype)


def test_rows_without_adapter_get_no_update():
    ad = make_adapters(2, 8, K, N, mx.bfloat16)
    x = random_float((5, K), mx.bfloat16)
    idx = mx.full((5,), -1, dtype=mx.int32)
    np.testing.assert_array_equal(np.array(lora.lora_delta(x, idx, *ad.args()).astype(mx.float32)), 0)
    y = random_float((5, N), mx.bfloat16, seed=9)
    y = mx.where(mx.arange(N) % 2 == 0, y, -0.0)  # -0.0 stays -0.0: no update is no addition
    assert bits(lora.lora_apply(y, x, idx, *ad.args())) == bits(y)


def test_zero_rows():
    ad = make_adapters(2, 8, K, N)
    out = lora.lora_delta(mx.zeros((0, K)), mx.zeros((0,), dtype=mx.int32), *ad.args())
    assert out.shape == (0, N)
    y = lora.lora_apply(mx.zeros((0, 90)), mx.zeros((0, K)), mx.zeros((0,), dtype=mx.int32), *ad.args())
    assert y.shape == (0, 90)


def test_leading_dimensions_are_rows():
    ad = make_adapters(3, 8, K, N, seed=5)
    x = random_float((2, 5, K), seed=6)
    idx = mixed_idx(10, 3, seed=7)
    out = lora.lora_delta(x, idx, *ad.args())
    assert out.shape == (2, 5, N)
    assert_close(out, *delta64(x, idx, ad), mx.float32)


def test_strided_inputs_and_casts():
    # Views are read through copies; int64 idx and float16 scale are cast.
    ad = make_adapters(3, 8, K, N, seed=8)
    x = random_float((K, 9), seed=9).T
    a = mx.array(np.ascontiguousarray(np.array(ad.lora_a).transpose(0, 2, 1))).transpose(0, 2, 1)
    b = mx.array(np.ascontiguousarray(np.array(ad.lora_b).transpose(1, 0, 2))).transpose(1, 0, 2)
    idx = mixed_idx(9, 3, seed=10)
    out = lora.lora_delta(x, idx.astype(mx.int64), a, b, ad.scale.astype(mx.float16))
    assert_close(out, *delta64(x, idx, ad), mx.float32)


def test_fused_projection_slices_chain_in_place():
    # q, k, v of one fused projection: three target modules, one call each on the base output.
    widths, dtype = (64, 16, 16), mx.bfloat16
    x = random_float((6, K), dtype, seed=11)
    idx = mixed_idx(6, 2, seed=12)
    slices = [make_adapters(2, 8, K, w, dtype, seed=20 + i) for i, w in enumerate(widths)]
    offsets = np.cumsum((0, *widths))[:-1].tolist()

    def chain(y):
        for ad, off in zip(slices, offsets):
            y = lora.lora_apply(y, x, idx, *ad.args(), column_offset=off)
        return y

    base = random_float((6, sum(widths)), dtype, seed=13)
    mx.eval(base)
    held = chain(base)  # base stays referenced: every call copies
    mx.eval(held)
    for _ in range(5):  # whatever the stream thread's timing
        y = base + 0  # a temporary only the chain holds: each call reuses its buffer
        mx.eval(y)
        address = get_ops().data_ptr(y)
        donated = chain(y)
        del y
        mx.eval(donated)
        assert get_ops().data_ptr(donated) == address
        assert bits(held) == bits(donated)
    expected = as_f64(base)
    magnitude = np.abs(expected)
    for ad, off in zip(slices, offsets):
        update, mag = delta64(x, idx, ad)
        expected[:, off:off + update.shape[1]] += update
        magnitude[:, off:off + update.shape[1]] += mag
    assert_close(held, expected, magnitude, dtype)


def batch_case(dtype, rows, k=1000, n=1500, rank=16, slots=4, seed=0):
    ad = make_adapters(slots, rank, k, n, dtype, seed=seed)
    x = random_float((rows, k), dtype, seed=seed + 1)
    return ad, x, mixed_idx(rows, slots, seed=seed + 2)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_a_row_is_the_same_bits_alone_or_in_any_batch(dtype):
    # Big enough for the pool: threads, groups and tiles change with the batch, a row's sums do not.
    ad, x, idx = batch_case(dtype, 64)
    y = random_float((64, 1700), dtype, seed=5)
    batch = lora.lora_delta(x, idx, *ad.args())
    applied = lora.lora_apply(y, x, idx, *ad.args(), column_offset=100)
    order = np.random.default_rng(0).permutation(64)
    shuffled = lora.lora_delta(x[mx.array(order)], idx[mx.array(order)], *ad.args())
    mx.eval(batch, applied, shuffled)
    for t in (0, 5, 17, 63):
        one = slice(t, t + 1)
        assert bits(lora.lora_delta(x[one], idx[one], *ad.args())) == bits(batch[one])
        assert bits(lora.lora_apply(y[one], x[one], idx[one], *ad.args(), column_offset=100)) == bits(applied[one])
        assert bits(shuffled[int(np.argsort(order)[t])][None]) == bits(batch[one])
    # Other adapters joining the step, or the row's neighbours changing, change nothing.
    mixed = mx.concatenate([x[:8], x[:8]])
    other = mx.concatenate([idx[:8], (idx[:8] + 1) % 4])
    again = lora.lora_delta(mixed, other, *ad.args())
    assert bits(again[:8]) == bits(batch[:8])


def test_runs_are_deterministic():
    ad, x, idx = batch_case(mx.float32, 300, seed=3)
    first = bits(lora.lora_delta(x, idx, *ad.args()))
    for _ in range(3):
        assert bits(lora.lora_delta(x, idx, *ad.args())) == first


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_cpu_isa_variant(isa, dtype):
    ad, x, idx = batch_case(dtype, 13, k=70, n=45, rank=11, slots=3, seed=4)
    y = random_float((13, 60), dtype, seed=6)
    with cpu_isa(isa):
        out = lora.lora_delta(x, idx, *ad.args())
        applied = lora.lora_apply(y, x, idx, *ad.args(), column_offset=7)
        alone = [lora.lora_delta(x[t:t + 1], idx[t:t + 1], *ad.args()) for t in range(13)]
        mx.eval(out, applied, *alone)
    assert_close(out, *delta64(x, idx, ad), dtype)
    assert bits(mx.concatenate(alone)) == bits(out)
    update, mag = delta64(x, idx, ad)
    expected, magnitude = as_f64(y), np.abs(as_f64(y))
    expected[:, 7:52] += update
    magnitude[:, 7:52] += mag
    assert_close(applied, expected, magnitude, dtype)


@pytest.mark.parametrize("half", [mx.bfloat16, mx.float16], ids=str)
def test_half_stacks_beside_float32_rows_read_as_float32(half):
    # --lora-dtype below float32 activations: the stacks are read as fp32 on load,
    # so the result is the float32 op's on the stacks' rounded values, to the bit.
    ad = make_adapters(3, 16, K, N, half, seed=12)
    x = random_float((9, K), seed=13)
    y = random_float((9, N + 10), seed=14)
    idx = mixed_idx(9, 3, seed=15)
    wide = [ad.lora_a.astype(mx.float32), ad.lora_b.astype(mx.float32), ad.scale]
    assert bits(lora.lora_delta(x, idx, *ad.args())) == bits(lora.lora_delta(x, idx, *wide))
    assert bits(lora.lora_apply(y, x, idx, *ad.args(), column_offset=4)) == bits(
        lora.lora_apply(y, x, idx, *wide, column_offset=4))
    assert_close(lora.lora_delta(x, idx, *ad.args()), *delta64(x, idx, ad), mx.float32)


def test_idx_outside_the_slots_raises_at_evaluation():
    ad = make_adapters(4, 8, K, N)
    x = random_float((3, K))
    for bad in (4, -2):
        out = lora.lora_delta(x, mx.array([0, bad, -1], dtype=mx.int32), *ad.args())
        with pytest.raises(RuntimeError, match=rf"idx\[1\] = {bad} is outside \[-1, 4\): 4 adapter slots"):
            mx.eval(out)


def test_every_slot_and_rank_combination_at_small_sizes():
    # Group boundaries: one row per slot, all rows one slot, a slot unused.
    for rows, slots in itertools.product((2, 5, 33), (1, 2, 4)):
        ad = make_adapters(slots, 5, 19, 23, seed=rows)
        x = random_float((rows, 19), seed=slots)
        idx = mx.array([(t * 7) % (slots + 1) - 1 for t in range(rows)], dtype=mx.int32)
        assert_close(lora.lora_delta(x, idx, *ad.args()), *delta64(x, idx, ad), mx.float32)
