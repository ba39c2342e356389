"""The chunked gated delta kernel (kernels_v2/gdn_chunked.h) on the MSL harness,
launched as the host plans it (chunk > 0, scalar gates), against the float64
oracle of the recurrence and the CPU op's and the pure-MLX chunked forms, under two
lane orders. Chunk boundaries change only the rounding, so every comparison is to a
tolerance; pages start NaN outside the states that requests continue, as in test_gdn."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.test_gdn import run_gated_delta
from tests.ops.test_gdn import TOLERANCE, assert_pages, assert_rows, make_delta
from vllm_metal.ops.gdn import gated_delta
from vllm_metal.ops.reference import gated_delta_pages_ref

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
MODES = pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])


def check(kernels, ext, case, chunk, **kwargs):
    """Run the chunked kernel and compare y and both pages with the oracle."""
    y, lo, hi = run_gated_delta(kernels, ext, case, chunk=chunk, **kwargs)
    want_y, want_lo, want_hi = case.expected()
    assert_rows(mx.array(y), want_y, case.inputs[0].dtype)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)
    return y, lo, hi


@MODES
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_mixed_batch_matches_the_float64_oracle(kernels, ext, dtype, delta):
    # A 70-row prompt (chunks of 32, 32, 6), decode rows with and without a state, a
    # request without rows, 5 rows continuing a state; heads split over lo and hi;
    # Dv = 40: a full and a partial tile of 32 state rows.
    case = make_delta([70, 1, 0, 5, 1], [False, True, True, True, False], hk=1, hv=3, dk=64,
                      dv=40, heads_in_lo=2, dtype=dtype, seed=31, delta=delta)
    check(kernels, ext, case, chunk=32)


@MODES
@pytest.mark.parametrize("chunk", [32, 64])
def test_the_cpu_op_and_the_mlx_reference_in_chunks_agree(kernels, ext, chunk, delta):
    case = make_delta([100, 1, 0, 9], [False, True, True, True], hk=1, hv=2, dk=64, dv=40,
                      heads_in_lo=1, dtype=mx.float16, seed=39, delta=delta)
    y, lo, hi = run_gated_delta(kernels, ext, case, chunk=chunk)
    tolerance = 2 * TOLERANCE[mx.float16]
    for other in (gated_delta(*case.args(), delta=delta, chunk=chunk),
                  gated_delta_pages_ref(*case.args(), delta=delta, chunk=chunk)):
        other_y, other_lo, other_hi = (np.array(a.astype(mx.float32)) for a in other)
        np.testing.assert_allclose(y, other_y, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(lo, other_lo, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(hi, other_hi, rtol=2e-5, atol=2e-5)

@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunk_sizes_from_one_row_to_the_largest(kernels, ext, chunk):
    case = make_delta([130, 2], [True, False], hk=2, hv=4, dk=32, dv=16, seed=32)
    check(kernels, ext, case, chunk=chunk)


@MODES
def test_qwen3_next_widths(kernels, ext, delta):
    # Dk = Dv = 128, two value heads per key head, bfloat16 rows, two chunks of 64.
    case = make_delta([70, 1], [False, True], hk=1, hv=2, dk=128, dv=128, dtype=mx.bfloat16,
                      heads_in_lo=1, seed=33, delta=delta)
    check(kernels, ext, case, chunk=64, orders=("forward", "shuffled"))


@pytest.mark.parametrize("dk,dv", [(256, 256), (32, 6)], ids=["widest", "narrowest"])
def test_widest_and_narrowest_heads(kernels, ext, dk, dv):
    case = make_delta([40, 1], [True, False], hk=1, hv=1, dk=dk, dv=dv, dtype=mx.float16,
                      seed=34)
    check(kernels, ext, case, chunk=32)


@MODES
def test_a_prompt_in_two_calls_equals_the_prompt_at_once(kernels, ext, delta):
    whole = make_delta([100], [False], seed=35, delta=delta)
    y_whole, lo_whole, hi_whole = run_gated_delta(kernels, ext, whole, chunk=32)
    lo, hi, ys = whole.lo, whole.hi, []
    for start, stop in ((0, 37), (37, 100)):  # the second call's chunks start at row 37
        part = replace(whole, inputs=tuple(a[start:stop] for a in whole.inputs), lo=lo, hi=hi,
                       lengths=[stop - start], has_state=[start > 0])
        y, lo, hi = run_gated_delta(kernels, ext, part, chunk=32)
        ys.append(y)
    tolerance = TOLERANCE[mx.float32]
    np.testing.assert_allclose(np.concatenate(ys), y_whole, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(lo, lo_whole, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(hi, hi_whole, rtol=tolerance, atol=tolerance)


@MODES
def test_gates_of_zero_one_and_underflow_give_no_nan(kernels, ext, delta):
    # Ratios are products over (i, t]: a quotient of cumulative products would be 0 / 0.
    case = make_delta([45, 9], [True, True], hk=2, hv=4, dk=32, dv=6, seed=36, delta=delta)
    g = np.array(case.inputs[3])
    g[3] = 0.0
    g[10] = 1e-30
    g[11:20, 1] = 1.0
    g[20:40, 2] = 1e-20  # products underflow to zero within the chunk
    g[46, 0] = 1e-38     # a subnormal
    case.inputs = (*case.inputs[:3], mx.array(g), case.inputs[4])
    case.inputs64 = (*case.inputs64[:3], g.astype(np.float64), case.inputs64[4])
    y, _, _ = check(kernels, ext, case, chunk=32, guard=True)
    assert np.isfinite(y).all()


def test_a_request_is_the_same_bits_alone_or_in_a_batch(kernels, ext):
    case = make_delta([4, 40, 5], [True, False, True], dtype=mx.float16, seed=37)
    y, lo, hi = run_gated_delta(kernels, ext, case, chunk=16)
    alone = replace(case, inputs=tuple(a[4:44] for a in case.inputs), slots=case.slots[1:2],
                    lengths=[40], has_state=[False])
    y_alone, lo_alone, hi_alone = run_gated_delta(kernels, ext, alone, chunk=16)
    assert y[4:44].tobytes() == y_alone.tobytes()
    slot = case.slots[1]
    assert lo[slot].tobytes() == lo_alone[slot].tobytes()
    assert hi[slot].tobytes() == hi_alone[slot].tobytes()


def test_a_slot_outside_the_pages_gives_nan_rows_and_writes_nothing(kernels, ext):
    case = make_delta([2, 3], [True, True], dv=40, seed=38)
    case.slots = [99, case.slots[1]]
    y, lo, hi = run_gated_delta(kernels, ext, case, chunk=64, guard=True)
    assert np.isnan(y[:2]).all() and np.isfinite(y[2:]).all()
    others = [b for b in range(case.lo.shape[0]) if b != case.slots[1]]
    assert lo[others].tobytes() == case.lo[others].tobytes()
    assert hi[others].tobytes() == case.hi[others].tobytes()
