"""The LoRA kernels (kernels_v2/lora.metal) on the MSL harness, launched as the
host plans them (debug.lora_launch_plan, what eval_gpu encodes), against the
float64 oracle and the pure-MLX reference; a row's result is the same bits alone
or in any batch, and in place or copied."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import (DEFAULT_ORDERS, DTYPE_NAMES, as_float32, assert_same_bits, check_orders,
                                       find_library, nan_like, raw)
from tests.ops.lora_inputs import FLOATS, Adapters, as_f64, assert_close, delta64, make_adapters, mixed_idx, random_float
from tools.msl_harness import KERNELS_DIR
from vllm_metal.ops.reference import lora_delta_ref

K, N = 100, 77


def run_lora(kernels, ext, x: mx.array, idx: mx.array, ad: Adapters, *, y: mx.array | None = None,
             column_offset: int = 0, in_place: bool = False, orders: tuple[str, ...] = DEFAULT_ORDERS,
             guard: bool = False) -> np.ndarray:
    """out as float32 [T, out_cols]: the planned shrink and expand launches under each
    of `orders` (which must agree bit for bit). in_place: out is y's own buffer,
    as when eval_gpu reuses a donated y."""
    check_orders(orders)
    rows, k = x.shape
    slots, rank, _ = ad.lora_a.shape
    n = ad.lora_b.shape[2]
    out_cols = y.shape[1] if y is not None else n
    plan = ext.debug.lora_launch_plan(DTYPE_NAMES[x.dtype], rows, k, n, rank, slots, add=y is not None,
                                      out_cols=out_cols, column_offset=column_offset, in_place=in_place)
    results = []
    for order in orders:
        y_raw = raw(y) if y is not None else None
        out = y_raw if in_place else nan_like((rows, out_cols), raw(x))
        buffers = {0: raw(x), 1: np.array(idx, np.int32), 2: raw(ad.lora_a), 3: np.array(ad.scale, np.float32),
                   4: np.full(max(plan["u_floats"], 1), np.nan, np.float32), 5: plan["params"],
                   6: raw(ad.lora_b), 7: y_raw if y_raw is not None else out, 8: out}
        for launch in plan["launches"]:
            find_library(kernels, launch["kernel"]).dispatch(
                launch["kernel"], launch["grid"], launch["threads"], buffers, order=order, guard=guard)
        results.append(out)
    assert_same_bits(results, orders)
    return as_float32(results[0], x.dtype)


@pytest.mark.parametrize("rows,rank", [(1, 1), (7, 8), (64, 16), (300, 64)])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_update_matches_the_reference(kernels, ext, dtype, rows, rank):
    ad = make_adapters(4, rank, K, N, dtype, seed=rank)
    x = random_float((rows, K), dtype, seed=rows)
    idx = mixed_idx(rows, 4, seed=rows + rank)
    got = run_lora(kernels, ext, x, idx, ad)
    expected, magnitude = delta64(x, idx, ad)
    assert_close(got, expected, magnitude, dtype)
    # The pure-MLX reference, held to the same oracle, agrees with the kernels as closely.
    ref = as_f64(lora_delta_ref(x, idx, *ad.args()))
    assert_close(got, ref, magnitude + np.abs(expected), dtype)


@pytest.mark.parametrize("in_place", [False, True], ids=["copied", "in_place"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_apply_writes_its_slice(kernels, ext, dtype, in_place):
    rows = 9
    ad = make_adapters(3, 16, K, N, dtype, seed=1)
    x = random_float((rows, K), dtype, seed=2)
    y = random_float((rows, 200), dtype, seed=3)
    idx = mixed_idx(rows, 3, seed=4)
    got = run_lora(kernels, ext, x, idx, ad, y=y, column_offset=60, in_place=in_place,
                   orders=("forward", "shuffled"))
    update, magnitude = delta64(x, idx, ad)
    expected = as_f64(y)
    expected[:, 60:60 + N] += update
    full_mag = np.abs(as_f64(y))
    full_mag[:, 60:60 + N] += magnitude
    assert_close(got, expected, full_mag, dtype)
    keep = np.ones(y.shape, bool)
    keep[np.array(idx) >= 0, 60:60 + N] = False
    np.testing.assert_array_equal(got[keep], np.array(y.astype(mx.float32))[keep])
    other = run_lora(kernels, ext, x, idx, ad, y=y, column_offset=60, in_place=not in_place)
    np.testing.assert_array_equal(got, other)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_a_row_is_the_same_bits_alone_or_in_a_batch(kernels, ext, dtype):
    ad = make_adapters(4, 16, K, N, dtype, seed=5)
    x = random_float((40, K), dtype, seed=6)
    idx = mixed_idx(40, 4, seed=7)
    batch = run_lora(kernels, ext, x, idx, ad)
    for t in (0, 13, 39):
        alone = run_lora(kernels, ext, x[t:t + 1], idx[t:t + 1], ad)
        assert alone.tobytes() == batch[t:t + 1].tobytes()


def test_idx_outside_the_slots_gets_no_update(kernels, ext):
    # A kernel cannot raise (the host checks idx it knows): such rows keep y, or get zeros.
    ad = make_adapters(2, 8, K, N, seed=8)
    x = random_float((4, K), seed=9)
    y = random_float((4, N), seed=10)
    idx = mx.array([0, 2, -2, 1], dtype=mx.int32)
    delta = run_lora(kernels, ext, x, idx, ad, guard=True)
    np.testing.assert_array_equal(delta[1:3], 0)
    applied = run_lora(kernels, ext, x, idx, ad, y=y, guard=True)
    np.testing.assert_array_equal(applied[1:3], np.array(y)[1:3])
    assert_close(delta[[0, 3]], *(a[[0, 3]] for a in delta64(x, mx.array([0, -1, -1, 1]), ad)), mx.float32)


def test_guarded_launches_stay_in_bounds(kernels, ext):
    # Sizes off every tile: 33 rank rows (a partial threadgroup of simdgroups), 130 columns.
    ad = make_adapters(3, 33, 45, 130, mx.float16, seed=11)
    x = random_float((5, 45), mx.float16, seed=12)
    idx = mixed_idx(5, 3, seed=13)
    got = run_lora(kernels, ext, x, idx, ad, guard=True)
    assert_close(got, *delta64(x, idx, ad), mx.float16)
    y = random_float((5, 150), mx.float16, seed=14)
    run_lora(kernels, ext, x, idx, ad, y=y, column_offset=20, guard=True)


def test_the_plan(ext):
    plan = ext.debug.lora_launch_plan("bfloat16", 7, 100, 77, 16, 4, add=True, out_cols=300, column_offset=40,
                                      in_place=True)
    shrink, expand = plan["launches"]
    assert shrink == {"kernel": "lora_shrink_bfloat16", "grid": (4, 7, 1), "threads": (128, 1, 1),
                      "library": "main"}
    assert expand == {"kernel": "lora_expand_add_bfloat16", "grid": (1, 7, 1), "threads": (128, 1, 1),
                      "library": "main"}
    assert plan["u_floats"] == 7 * 16
    params = np.frombuffer(plan["params"], np.int32)
    # In place, only the slice's columns: first_column 40, launch_columns 77.
    assert params.tolist() == [7, 100, 77, 16, 4, 300, 40, 40, 77]
    copied = ext.debug.lora_launch_plan("float32", 7, 100, 77, 16, 4, add=True, out_cols=300, column_offset=40)
    assert np.frombuffer(copied["params"], np.int32).tolist()[-2:] == [0, 300]
    assert copied["launches"][1]["grid"] == (3, 7, 1)
    with pytest.raises(ValueError, match="must lie within"):
        ext.debug.lora_launch_plan("float32", 7, 100, 77, 16, 4, add=True, out_cols=100, column_offset=40)


def test_params_block_is_packed_four_byte_scalars(ext):
    fields, size = ext.debug.lora_params_layout()
    assert [offset for _, offset in fields] == [4 * i for i in range(len(fields))]
    assert size == 4 * len(fields)
    header = (KERNELS_DIR / "lora_params.h").read_text()
    body = header[header.index("struct LoraParams"):header.index("};")]
    assert [name for name, _ in fields] == re.findall(r"^\s*int\s+(\w+);", body, re.MULTILINE)
