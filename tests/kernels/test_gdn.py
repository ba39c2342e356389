"""The Gated DeltaNet kernels (kernels_v2/gdn.metal) on the MSL harness, launched as
the host plans them (debug.gdn_launch_plan, what eval_gpu encodes), against the
float64 oracle and the CPU op, under two lane orders. Pages start NaN outside the
states that requests continue, so a read or a write of anything else shows."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import (DEFAULT_ORDERS, DTYPE_NAMES, as_float32, assert_same_bits,
                                       check_orders, find_library, nan_like, raw)
from tests.ops.test_gdn import (MIXED, TOLERANCE, ConvCase, DeltaCase, assert_pages, assert_rows,
                                make_conv, make_delta)
from tools.msl_harness import KERNELS_DIR
from vllm_metal.ops.gdn import gated_delta, short_conv

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# The second has a request without rows this step.
BATCHES = [MIXED, dict(lengths=[2, 0, 3], has_state=[True, False, True])]


def _batch(slots, lengths, has_state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return np.asarray(slots, np.int32), cu, np.asarray(has_state, np.int32)


def _launch_all(kernels, plan, buffers, order, guard) -> None:
    for launch in plan["launches"]:
        find_library(kernels, launch["kernel"]).dispatch(
            launch["kernel"], launch["grid"], launch["threads"], buffers, order=order, guard=guard)


def run_short_conv(kernels, ext, case: ConvCase, orders=DEFAULT_ORDERS, guard=False):
    """(y as float32 [T, C], lo after the launches)."""
    check_orders(orders)
    x = raw(case.x)
    plan = ext.debug.gdn_launch_plan(
        "short_conv", DTYPE_NAMES[case.x.dtype], x.shape[0], num_seqs=len(case.slots),
        num_blocks=case.pages.shape[0], lo_width=case.pages.shape[1], channels=x.shape[1],
        taps=case.weight.shape[1], conv_offset=case.conv_offset)
    slots, cu, has_state = _batch(case.slots, case.lengths, case.has_state)
    ys, pages = [], []
    for order in orders:
        buffers = {0: x, 1: np.array(case.weight.astype(mx.float32)), 2: case.pages.copy(),
                   3: slots, 4: cu, 5: has_state, 6: nan_like(x.shape, x), 7: plan["params"]}
        _launch_all(kernels, plan, buffers, order, guard)
        ys.append(buffers[6])
        pages.append(buffers[2])
    assert_same_bits(ys, orders)
    assert_same_bits(pages, orders)
    return as_float32(ys[0], case.x.dtype), pages[0]


def run_gated_delta(kernels, ext, case: DeltaCase, orders=DEFAULT_ORDERS, guard=False, chunk=0):
    """(y as float32 [T, Hv, Dv], lo, hi after the launch); chunk > 0: the chunked kernel."""
    check_orders(orders)
    q, k, v, g, beta = case.inputs
    plan = ext.debug.gdn_launch_plan(
        "gated_delta", DTYPE_NAMES[q.dtype], q.shape[0], num_seqs=len(case.slots),
        num_blocks=case.lo.shape[0], lo_width=case.lo.shape[1], hi_width=case.hi.shape[1],
        num_k_heads=q.shape[1], num_v_heads=v.shape[1], head_k_dim=q.shape[2],
        head_v_dim=v.shape[2], ssm_offset=case.ssm_offset, heads_in_lo=case.heads_in_lo,
        vector_gate=g.ndim == 3, delta_rule=case.delta, chunk=chunk)
    slots, cu, has_state = _batch(case.slots, case.lengths, case.has_state)
    results = []
    for order in orders:
        buffers = {0: raw(q), 1: raw(k), 2: raw(v), 3: np.array(g.astype(mx.float32)),
                   4: np.array(beta.astype(mx.float32)), 5: case.lo.copy(), 6: case.hi.copy(),
                   7: slots, 8: cu, 9: has_state, 10: nan_like(v.shape, raw(v)),
                   11: plan["params"]}
        _launch_all(kernels, plan, buffers, order, guard)
        results.append((buffers[10], buffers[5], buffers[6]))
    for i in range(3):
        assert_same_bits([r[i] for r in results], orders)
    y, lo, hi = results[0]
    return as_float32(y, q.dtype), lo, hi


@pytest.mark.parametrize("conv_offset", [0, 37])
@pytest.mark.parametrize("batch", BATCHES, ids=["mixed", "a_request_without_rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_short_conv_matches_the_float64_oracle_and_the_cpu_op(kernels, ext, dtype, batch,
                                                              conv_offset):
    # 200 channels: two threadgroups, the second partly idle.
    case = make_conv(**batch, dtype=dtype, channels=200, conv_offset=conv_offset, seed=21)
    y, lo = run_short_conv(kernels, ext, case)
    want_y, want_lo = case.expected()
    assert_rows(mx.array(y), want_y, dtype)
    assert_pages(lo, want_lo, case.pages)
    cpu_y, cpu_lo = short_conv(*case.args(), conv_offset)
    tolerance = 2 * TOLERANCE[dtype]
    np.testing.assert_allclose(y, np.array(cpu_y.astype(mx.float32)), rtol=tolerance,
                               atol=tolerance)
    assert lo.tobytes() == np.array(cpu_lo).tobytes()  # the state is the inputs, copied


@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
@pytest.mark.parametrize("vector_gate", [False, True], ids=["scalar_gate", "vector_gate"])
@pytest.mark.parametrize("batch", BATCHES, ids=["mixed", "a_request_without_rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gated_delta_matches_the_float64_oracle_and_the_cpu_op(kernels, ext, dtype, batch,
                                                               vector_gate, delta):
    case = make_delta(**batch, dtype=dtype, vector_gate=vector_gate, hk=1, hv=3, dk=64, dv=6,
                      heads_in_lo=2, seed=22, delta=delta)
    y, lo, hi = run_gated_delta(kernels, ext, case)
    want_y, want_lo, want_hi = case.expected()
    assert_rows(mx.array(y), want_y, dtype)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)
    cpu_y, cpu_lo, cpu_hi = gated_delta(*case.args(), delta=delta)
    tolerance = 2 * TOLERANCE[dtype]
    np.testing.assert_allclose(y, np.array(cpu_y.astype(mx.float32)), rtol=tolerance,
                               atol=tolerance)
    np.testing.assert_allclose(lo, np.array(cpu_lo), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(hi, np.array(cpu_hi), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
def test_gated_delta_qwen3_next_widths(kernels, ext, delta):
    # Dk = Dv = 128, two value heads per key head, bfloat16 rows.
    case = make_delta([3, 1], [False, True], hk=1, hv=2, dk=128, dv=128, dtype=mx.bfloat16,
                      heads_in_lo=1, seed=23, delta=delta)
    y, lo, hi = run_gated_delta(kernels, ext, case, orders=("forward", "shuffled"))
    want_y, want_lo, want_hi = case.expected()
    assert_rows(mx.array(y), want_y, mx.bfloat16)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)


def test_a_request_is_the_same_bits_alone_or_in_a_batch(kernels, ext):
    case = make_delta([4, 2, 5], [True, False, True], dtype=mx.float16, seed=24)
    y, lo, hi = run_gated_delta(kernels, ext, case)
    alone = make_delta([4, 2, 5], [True, False, True], dtype=mx.float16, seed=24)
    alone.inputs = tuple(a[4:6] for a in alone.inputs)
    alone.slots, alone.lengths, alone.has_state = alone.slots[1:2], [2], [False]
    y_alone, lo_alone, hi_alone = run_gated_delta(kernels, ext, alone)
    assert y[4:6].tobytes() == y_alone.tobytes()
    slot = case.slots[1]
    assert lo[slot].tobytes() == lo_alone[slot].tobytes()
    assert hi[slot].tobytes() == hi_alone[slot].tobytes()


def test_a_slot_outside_the_pages_gives_nan_rows_and_writes_nothing(kernels, ext):
    delta = make_delta([2, 3], [True, True], seed=25)
    delta.slots = [99, delta.slots[1]]
    y, lo, hi = run_gated_delta(kernels, ext, delta, guard=True)
    assert np.isnan(y[:2]).all() and np.isfinite(y[2:]).all()
    others = [b for b in range(delta.lo.shape[0]) if b != delta.slots[1]]
    assert lo[others].tobytes() == delta.lo[others].tobytes()
    assert hi[others].tobytes() == delta.hi[others].tobytes()
    conv = make_conv([2, 3], [True, True], seed=25)
    conv.slots = [99, conv.slots[1]]
    y, lo = run_short_conv(kernels, ext, conv, guard=True)
    assert np.isnan(y[:2]).all() and np.isfinite(y[2:]).all()
    others = [b for b in range(conv.pages.shape[0]) if b != conv.slots[1]]
    assert lo[others].tobytes() == conv.pages[others].tobytes()


def test_the_plans(ext):
    plan = ext.debug.gdn_launch_plan
    conv = plan("short_conv", "bfloat16", 7, num_seqs=3, num_blocks=9, lo_width=24576,
                channels=8192, taps=4)
    assert [launch["kernel"] for launch in conv["launches"]] == [
        "gdn_short_conv_bfloat16", "gdn_conv_state_bfloat16"]
    assert [launch["grid"] for launch in conv["launches"]] == [(64, 7, 1), (64, 3, 1)]
    assert all(launch["threads"] == (128, 1, 1) for launch in conv["launches"])
    ints = np.frombuffer(conv["params"], np.int32).tolist()
    assert ints[:8] == [7, 3, 9, 24576, 0, 8192, 4, 0]
    # No rows this step: the state launch alone (fresh requests still clear their state).
    empty = plan("short_conv", "float16", 0, num_seqs=2, num_blocks=4, lo_width=96, channels=32,
                 taps=4)
    assert [launch["kernel"] for launch in empty["launches"]] == ["gdn_conv_state_float16"]
    heads = 32 * 128 * 128
    delta = plan("gated_delta", "float32", 5, num_seqs=2, num_blocks=9, lo_width=heads,
                 hi_width=heads, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                 ssm_offset=24576, heads_in_lo=0, vector_gate=True)
    (launch,) = delta["launches"]
    assert launch["kernel"] == "gdn_gated_delta_float32"
    assert launch["grid"] == (32, 32, 2) and launch["threads"] == (32, 1, 1)
    ints = np.frombuffer(delta["params"], np.int32).tolist()
    assert ints[8:] == [16, 32, 128, 128, 24576, 0, 1, 1, 0]
    linear = plan("gated_delta", "float32", 5, num_seqs=2, num_blocks=9, lo_width=heads,
                  hi_width=heads, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                  head_v_dim=128, delta_rule=False)
    assert np.frombuffer(linear["params"], np.int32).tolist()[-2:] == [0, 0]
    with pytest.raises(ValueError, match="Dk a multiple of 32 up to 256"):
        plan("gated_delta", "float16", 1, num_seqs=1, num_blocks=1, lo_width=4096, hi_width=4096,
             num_k_heads=1, num_v_heads=1, head_k_dim=48, head_v_dim=16)
    with pytest.raises(ValueError, match="does not fit lo at conv_offset"):
        plan("short_conv", "float16", 1, num_seqs=1, num_blocks=1, lo_width=96, channels=32,
             taps=4, conv_offset=1)
    with pytest.raises(ValueError, match="do not fit"):
        plan("gated_delta", "float16", 1, num_seqs=1, num_blocks=1, lo_width=100, hi_width=100,
             num_k_heads=1, num_v_heads=1, head_k_dim=32, head_v_dim=16)



def test_the_chunked_plan(ext):
    plan = ext.debug.gdn_launch_plan
    heads = 32 * 128 * 128
    qwen = dict(num_seqs=2, num_blocks=9, lo_width=heads, hi_width=heads, num_k_heads=16,
                num_v_heads=32, head_k_dim=128, head_v_dim=128)
    chunked = plan("gated_delta", "bfloat16", 70, **qwen, chunk=64)
    (launch,) = chunked["launches"]
    assert launch["kernel"] == "gdn_gated_delta_chunked_bfloat16"
    # Tiles of 32 state rows, 8 simdgroups each.
    assert launch["grid"] == (4, 32, 2) and launch["threads"] == (256, 1, 1)
    assert np.frombuffer(chunked["params"], np.int32).tolist()[-3:] == [0, 1, 64]
    linear = plan("gated_delta", "float16", 3, **dict(qwen, head_v_dim=40), delta_rule=False,
                  chunk=1)
    (launch,) = linear["launches"]
    assert launch["kernel"] == "gdn_gated_delta_chunked_float16" and launch["grid"] == (2, 32, 2)
    assert np.frombuffer(linear["params"], np.int32).tolist()[-2:] == [0, 1]
    # A vector gate keeps the recurrence, whatever the chunk; so does chunk 0.
    for kwargs in (dict(vector_gate=True, chunk=64), dict(vector_gate=True, chunk=500), {}):
        recurrent = plan("gated_delta", "float32", 70, **qwen, **kwargs)
        assert [launch["kernel"] for launch in recurrent["launches"]] == ["gdn_gated_delta_float32"]
        assert np.frombuffer(recurrent["params"], np.int32).tolist()[-1] == 0
    with pytest.raises(ValueError, match="chunks of 1 to 64 rows"):
        plan("gated_delta", "float32", 70, **qwen, chunk=65)
    with pytest.raises(ValueError, match="chunk must be >= 0"):
        plan("gated_delta", "float32", 70, **qwen, chunk=-1)

def test_params_block_is_packed_four_byte_scalars(ext):
    fields, size = ext.debug.gdn_params_layout()
    assert [offset for _, offset in fields] == [4 * i for i in range(len(fields))]
    assert size == 4 * len(fields)
    header = (KERNELS_DIR / "gdn_params.h").read_text()
    body = header[header.index("struct GdnParams"):header.index("};")]
    declared = re.findall(r"^\s*(?:int|float)\s+(\w+);", body, re.MULTILINE)
    assert [name for name, _ in fields] == declared
