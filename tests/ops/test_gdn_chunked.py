"""ops.gdn.gated_delta's chunked form (chunk=32 / 64) against the float64 oracle of the
token recurrence, the pure-MLX chunked reference, and itself across a prompt split over
two steps. The pages start NaN outside the states requests continue (test_gdn's cases),
so a read or a write of anything else shows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from tests.ops.test_gdn import DTYPES, _rounded, assert_pages, assert_rows, make_delta
from vllm_metal.ops.gdn import gated_delta
from vllm_metal.ops.reference import gated_delta_pages_ref

CHUNKS = [32, 64]
MODES = dict(argvalues=[True, False], ids=["delta_rule", "linear"])
# A prompt over several chunks ending mid-chunk, two decode rows, a request without rows,
# prompts of exactly one chunk of either size, a lone new row, a continued chunk.
BATCH = dict(lengths=[150, 1, 0, 64, 32, 1, 33],
             has_state=[False, True, True, True, False, False, True])


def _check(case, y, lo, hi, dtype=mx.float32) -> None:
    want_y, want_lo, want_hi = case.expected()
    assert_rows(y, want_y, dtype)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)


@pytest.mark.parametrize("delta", **MODES)
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_mixed_batch_matches_the_float64_oracle(dtype, chunk, delta):
    case = make_delta(**BATCH, dtype=dtype, seed=31, delta=delta)
    y, lo, hi = gated_delta(*case.args(), delta=delta, chunk=chunk)
    assert y.shape == case.inputs[2].shape and y.dtype == dtype
    _check(case, y, lo, hi, dtype)


@pytest.mark.parametrize("delta", **MODES)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_op_matches_the_mlx_chunked_reference(chunk, delta):
    case = make_delta(**BATCH, seed=32, delta=delta)
    y, lo, hi = gated_delta(*case.args(), delta=delta, chunk=chunk)
    ref_y, ref_lo, ref_hi = gated_delta_pages_ref(*case.args(), delta=delta, chunk=chunk)
    assert_rows(y, np.array(ref_y, np.float64), mx.float32)
    assert_pages(lo, np.array(ref_lo, np.float64), case.lo)
    assert_pages(hi, np.array(ref_hi, np.float64), case.hi)


@pytest.mark.parametrize("delta", **MODES)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_prompt_in_two_steps_matches_the_prompt_at_once(chunk, delta):
    # 100 rows as 70 then 30: the second step's chunks start at row 70, not at 64 (or
    # 96), so only the rounding may differ.
    whole = make_delta([100], [False], seed=33, delta=delta)
    y_whole, lo_whole, hi_whole = gated_delta(*whole.args(), delta=delta, chunk=chunk)
    lo, hi = mx.array(whole.lo), mx.array(whole.hi)
    slots = mx.array(whole.slots, dtype=mx.int32)
    ys, start = [], 0
    for i, n in enumerate([70, 30]):
        part = [a[start:start + n] for a in whole.inputs]
        y, lo, hi = gated_delta(*part, lo, hi, slots, mx.array([0, n], dtype=mx.int32),
                                mx.array([i], dtype=mx.int32), whole.ssm_offset,
                                whole.heads_in_lo, delta=delta, chunk=chunk)
        ys.append(np.array(y, np.float64))
        start += n
    assert_rows(y_whole, np.concatenate(ys), mx.float32)
    assert_pages(lo, np.array(lo_whole, np.float64), whole.lo)
    assert_pages(hi, np.array(hi_whole, np.float64), whole.hi)
    _check(whole, y_whole, lo_whole, hi_whole)


@pytest.mark.parametrize("delta", **MODES)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_gates_of_zero_one_and_underflow(chunk, delta):
    # Exact 0 and 1, and a run of 1e-30 long enough for its products to underflow even
    # in double: no NaN or inf, and the oracle's values.
    case = make_delta([80, 5], [True, True], seed=34, delta=delta)
    g = np.array(case.inputs64[3])
    g[3, :] = 0.0
    g[10:20, 0] = 1.0
    g[30:45, 1] = 1e-30
    g[50, 2], g[51, 2] = 1e-30, 0.0
    g[70:, 3] = 1.0
    g_mx, g64 = _rounded(g, mx.float32)
    case.inputs = (*case.inputs[:3], g_mx, case.inputs[4])
    case.inputs64 = (*case.inputs64[:3], g64, case.inputs64[4])
    y, lo, hi = gated_delta(*case.args(), delta=delta, chunk=chunk)
    assert np.isfinite(np.array(y)).all()
    _check(case, y, lo, hi)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("delta", **MODES)
@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("dk,dv", [(128, 24), (40, 24), (8, 6)])
def test_every_instruction_set(isa, dk, dv, delta, chunk):
    # Dk 40 and 8, Dv 24 and 6 leave tails after whole vectors of either width (or hold
    # none); 75 rows end in a chunk of 11.
    case = make_delta([75, 1], [False, True], hk=1, hv=2, dk=dk, dv=dv, seed=35, delta=delta)
    with cpu_isa(isa):
        y, lo, hi = gated_delta(*case.args(), delta=delta, chunk=chunk)
        mx.eval(y, lo, hi)
    _check(case, y, lo, hi)


def test_qwen3_next_widths_in_bfloat16():
    # Dk = Dv = 128, two value heads per key head, the states split over lo and hi.
    case = make_delta([130, 1], [False, True], hk=2, hv=4, dk=128, dv=128, dtype=mx.bfloat16,
                      seed=36)
    y, lo, hi = gated_delta(*case.args(), chunk=64)
    _check(case, y, lo, hi, mx.bfloat16)


def test_a_vector_gate_keeps_the_token_recurrence():
    case = make_delta([70, 1], [False, True], vector_gate=True, seed=37)
    chunked = gated_delta(*case.args(), chunk=64)
    token = gated_delta(*case.args())
    for a, b in zip(chunked, token):
        np.testing.assert_array_equal(np.array(a), np.array(b))


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_last_chunk_under_eight_rows_goes_token_by_token(chunk):
    # Decode rows and short requests keep the recurrence's bits (the chunked form's
    # products would cost more than their token steps); eight rows are chunked.
    case = make_delta([1, 7, 1], [True, True, False], seed=40)
    for a, b in zip(gated_delta(*case.args(), chunk=chunk), gated_delta(*case.args())):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    eight = make_delta([8], [True], seed=40)
    y_chunked, y_token = (np.array(gated_delta(*eight.args(), chunk=c)[0]) for c in (chunk, 0))
    assert (y_chunked != y_token).any()
    np.testing.assert_allclose(y_chunked, y_token, rtol=1e-5, atol=1e-5)


def test_a_request_is_the_same_bits_alone_or_in_a_batch():
    case = make_delta([40, 90, 3], [True, False, True], seed=38)
    y, lo, hi = gated_delta(*case.args(), chunk=32)
    alone = make_delta([40, 90, 3], [True, False, True], seed=38)
    alone.inputs = tuple(a[40:130] for a in alone.inputs)
    alone.slots, alone.lengths, alone.has_state = alone.slots[1:2], [90], [False]
    y_alone, lo_alone, hi_alone = gated_delta(*alone.args(), chunk=32)
    np.testing.assert_array_equal(np.array(y)[40:130], np.array(y_alone))
    slot = case.slots[1]
    np.testing.assert_array_equal(np.array(lo)[slot], np.array(lo_alone)[slot])
    np.testing.assert_array_equal(np.array(hi)[slot], np.array(hi_alone)[slot])


@pytest.mark.parametrize("chunk", [-1, 1, 16, 48, 128])
def test_an_unsupported_chunk_is_named(chunk):
    case = make_delta([3, 1], [True, True], seed=39)
    with pytest.raises(ValueError, match=f"chunk must be 0 .* got {chunk}"):
        gated_delta(*case.args(), chunk=chunk)

