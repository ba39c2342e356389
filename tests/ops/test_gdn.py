"""The Gated DeltaNet ops (ops.gdn: short_conv, gated_delta) against the float64
oracles of test_gdn_reference and the pure-MLX page references.

Pages start NaN everywhere except the states of requests that continue one: a
kernel that reads another block, a gap inside a block, or the garbage of a
request starting from zeros fails the comparison, and one that writes them
changes their bits."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from tests.ops.test_gdn_reference import gated_delta_oracle, short_conv_oracle
from vllm_metal.ops.gdn import gated_delta, short_conv
from vllm_metal.ops.reference import gated_delta_pages_ref, short_conv_pages_ref

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
# Outputs of magnitude ~1 rounded to the dtype (float32: the accumulation order).
TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}
# The states stay float32 whatever the inputs: only the order of operations differs.
STATE_TOLERANCE = 1e-5
MIXED = dict(lengths=[5, 1, 1, 9], has_state=[False, True, True, True])


def _rounded(a: np.ndarray, dtype) -> tuple[mx.array, np.ndarray]:
    """a in dtype, and the float64 values it holds."""
    m = mx.array(a.astype(np.float32)).astype(dtype)
    return m, np.array(m.astype(mx.float32), np.float64)


def _batch_arrays(slots, lengths, has_state) -> tuple[mx.array, mx.array, mx.array]:
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return (mx.array(np.asarray(slots, np.int32)), mx.array(cu),
            mx.array(np.asarray(has_state, bool)))


def assert_pages(got: mx.array, want: np.ndarray, before: np.ndarray) -> None:
    """Entries NaN in `want` still hold their bits from `before`; the rest match."""
    got = np.array(got)
    untouched = np.isnan(want)
    assert got[untouched].view(np.uint32).tolist() == before[untouched].view(np.uint32).tolist()
    np.testing.assert_allclose(got[~untouched], want[~untouched], rtol=STATE_TOLERANCE,
                               atol=STATE_TOLERANCE)


def assert_rows(got: mx.array, want: np.ndarray, dtype) -> None:
    got = np.array(got.astype(mx.float32), np.float64)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@dataclass
class ConvCase:
    x: mx.array           # [T, C]
    weight: mx.array      # [C, K]
    pages: np.ndarray     # lo [num_blocks, W] float32 as given
    slots: list[int]
    lengths: list[int]
    has_state: list[bool]
    x64: np.ndarray
    weight64: np.ndarray
    conv_offset: int = 0  # where the state starts in lo (the references' is 0)

    def args(self):
        return (self.x, self.weight, mx.array(self.pages),
                *_batch_arrays(self.slots, self.lengths, self.has_state))

    def expected(self) -> tuple[np.ndarray, np.ndarray]:
        """float64 (y [T, C], lo after the call)."""
        channels, taps = self.weight64.shape
        held = np.s_[self.conv_offset:self.conv_offset + (taps - 1) * channels]
        dense = np.zeros((self.pages.shape[0], taps - 1, channels))
        for slot, keep in zip(self.slots, self.has_state):
            if keep:
                dense[slot] = self.pages[slot, held].reshape(taps - 1, channels)
        y, dense = short_conv_oracle(self.x64, self.weight64, dense, self.slots, self.lengths,
                                     self.has_state)
        pages = self.pages.astype(np.float64)
        for slot in self.slots:
            pages[slot, held] = dense[slot].reshape(-1)
        return y.reshape(self.x64.shape), pages


def make_conv(lengths, has_state, *, channels=24, taps=4, dtype=mx.float32, seed=0,
              width=None, num_blocks=None, conv_offset=0) -> ConvCase:
    rng = np.random.default_rng(seed)
    num_blocks = num_blocks or len(lengths) + 3
    floats = (taps - 1) * channels
    width = width or conv_offset + floats + 13
    slots = [int(s) for s in rng.permutation(num_blocks)[:len(lengths)]]
    x, x64 = _rounded(rng.normal(size=(sum(lengths), channels)), dtype)
    weight, weight64 = _rounded(rng.normal(size=(channels, taps)) / taps, dtype)
    pages = np.full((num_blocks, width), np.nan, np.float32)
    for slot, keep in zip(slots, has_state):
        if keep:  # a conv state holds earlier inputs: values of x's dtype
            _, held = _rounded(rng.normal(size=floats), dtype)
            pages[slot, conv_offset:conv_offset + floats] = held
    return ConvCase(x, weight, pages, slots, list(lengths), list(has_state), x64, weight64,
                    conv_offset)


@dataclass
class DeltaCase:
    inputs: tuple         # q, k, v, g, beta (mx, in their dtypes)
    inputs64: tuple       # the same as float64
    lo: np.ndarray        # [num_blocks, W_lo] float32 as given
    hi: np.ndarray        # [num_blocks, W_hi]
    ssm_offset: int
    heads_in_lo: int
    slots: list[int]
    lengths: list[int]
    has_state: list[bool]
    delta: bool = True    # False: the linear mode (no - S k)

    def args(self):
        return (*self.inputs, mx.array(self.lo), mx.array(self.hi),
                *_batch_arrays(self.slots, self.lengths, self.has_state), self.ssm_offset,
                self.heads_in_lo)

    def _regions(self):
        """(pages index, start column) of each head's state."""
        dv, dk = self.inputs64[2].shape[2], self.inputs64[0].shape[2]
        heads = self.inputs64[2].shape[1]
        per = dv * dk
        return [(0, self.ssm_offset + h * per) if h < self.heads_in_lo else
                (1, (h - self.heads_in_lo) * per) for h in range(heads)], dv, dk

    def expected(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float64 (y [T, Hv, Dv], lo and hi after the call)."""
        regions, dv, dk = self._regions()
        pages = [self.lo.astype(np.float64), self.hi.astype(np.float64)]
        dense = np.zeros((self.lo.shape[0], len(regions), dv, dk))
        for slot, keep in zip(self.slots, self.has_state):
            for h, (which, col) in enumerate(regions):
                if keep:
                    dense[slot, h] = pages[which][slot, col:col + dv * dk].reshape(dv, dk)
        y, dense = gated_delta_oracle(*self.inputs64, dense, self.slots, self.lengths,
                                      self.has_state, self.delta)
        for slot in self.slots:
            for h, (which, col) in enumerate(regions):
                pages[which][slot, col:col + dv * dk] = dense[slot, h].reshape(-1)
        return y, pages[0], pages[1]


def make_delta(lengths, has_state, *, hk=2, hv=4, dk=32, dv=16, dtype=mx.float32,
               vector_gate=False, heads_in_lo=None, seed=0, num_blocks=None,
               delta=True) -> DeltaCase:
    rng = np.random.default_rng(seed)
    t, per = sum(lengths), dv * dk
    num_blocks = num_blocks or len(lengths) + 3
    heads_in_lo = hv // 2 if heads_in_lo is None else heads_in_lo
    ssm_offset = 48  # past a conv state, as the real placement leaves one
    lo = np.full((num_blocks, max(ssm_offset + heads_in_lo * per + 5, (hv - heads_in_lo) * per)),
                 np.nan, np.float32)
    hi = np.full((num_blocks, lo.shape[1]), np.nan, np.float32)
    k = rng.normal(size=(t, hk, dk))
    arrays = [rng.normal(size=(t, hk, dk)) / np.sqrt(dk),
              k / np.linalg.norm(k, axis=-1, keepdims=True),
              rng.normal(size=(t, hv, dv)),
              rng.uniform(0.7, 1.0, size=(t, hv, dk) if vector_gate else (t, hv)),
              rng.uniform(0.0, 1.0, size=(t, hv))]
    pairs = [_rounded(a, dtype) for a in arrays]
    slots = [int(s) for s in rng.permutation(num_blocks)[:len(lengths)]]
    case = DeltaCase(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), lo, hi, ssm_offset,
                     heads_in_lo, slots, list(lengths), list(has_state), delta)
    regions, _, _ = case._regions()
    for slot, keep in zip(slots, has_state):
        for which, col in regions:
            if keep:
                (lo, hi)[which][slot, col:col + per] = rng.normal(size=per) * 0.5
    return case


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_short_conv_mixed_prefill_and_decode(dtype):
    # A new prompt, two decode rows (fewer rows than K - 1: old state rows shift in), a chunk.
    case = make_conv(**MIXED, dtype=dtype, seed=1)
    y, lo = short_conv(*case.args())
    want_y, want_lo = case.expected()
    assert y.shape == case.x.shape and y.dtype == dtype and lo.dtype == mx.float32
    assert_rows(y, want_y, dtype)
    assert_pages(lo, want_lo, case.pages)
    ref_y, ref_lo = short_conv_pages_ref(*case.args())
    assert_rows(y, np.array(ref_y.astype(mx.float32), np.float64), dtype)
    assert_pages(lo, np.array(ref_lo, np.float64), case.pages)


@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
@pytest.mark.parametrize("vector_gate", [False, True], ids=["scalar_gate", "vector_gate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gated_delta_mixed_prefill_and_decode(dtype, vector_gate, delta):
    case = make_delta(**MIXED, dtype=dtype, vector_gate=vector_gate, seed=2, delta=delta)
    y, lo, hi = gated_delta(*case.args(), delta=delta)
    want_y, want_lo, want_hi = case.expected()
    assert y.shape == case.inputs[2].shape and y.dtype == dtype
    assert_rows(y, want_y, dtype)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)
    ref_y, ref_lo, ref_hi = gated_delta_pages_ref(*case.args(), delta=delta)
    assert_rows(y, np.array(ref_y.astype(mx.float32), np.float64), dtype)
    assert_pages(lo, np.array(ref_lo, np.float64), case.lo)
    assert_pages(hi, np.array(ref_hi, np.float64), case.hi)


def test_short_conv_prompt_in_chunks_equals_the_prompt_at_once():
    whole = make_conv([13], [False], seed=3)
    want_y, _ = whole.expected()
    y_whole, lo_whole = short_conv(*whole.args())
    lo, ys, start = mx.array(whole.pages), [], 0
    slots = mx.array(whole.slots, dtype=mx.int32)
    for i, n in enumerate([5, 1, 7]):
        cu = mx.array([0, n], dtype=mx.int32)
        y, lo = short_conv(whole.x[start:start + n], whole.weight, lo, slots, cu,
                           mx.array([i > 0]))
        ys.append(np.array(y))
        start += n
    np.testing.assert_array_equal(np.concatenate(ys), np.array(y_whole))
    np.testing.assert_array_equal(np.array(lo), np.array(lo_whole))
    np.testing.assert_allclose(np.concatenate(ys), want_y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("delta", [True, False], ids=["delta_rule", "linear"])
@pytest.mark.parametrize("vector_gate", [False, True], ids=["scalar_gate", "vector_gate"])
def test_gated_delta_prompt_in_chunks_equals_the_prompt_at_once(vector_gate, delta):
    whole = make_delta([13], [False], vector_gate=vector_gate, seed=4)
    y_whole, lo_whole, hi_whole = gated_delta(*whole.args(), delta=delta)
    lo, hi = mx.array(whole.lo), mx.array(whole.hi)
    slots = mx.array(whole.slots, dtype=mx.int32)
    ys, start = [], 0
    for i, n in enumerate([5, 1, 7]):
        part = [a[start:start + n] for a in whole.inputs]
        y, lo, hi = gated_delta(*part, lo, hi, slots, mx.array([0, n], dtype=mx.int32),
                                mx.array([i], dtype=mx.int32), whole.ssm_offset,
                                whole.heads_in_lo, delta=delta)
        ys.append(np.array(y))
        start += n
    # Token by token, a chunk boundary changes nothing: the same bits.
    np.testing.assert_array_equal(np.concatenate(ys), np.array(y_whole))
    np.testing.assert_array_equal(np.array(lo), np.array(lo_whole))
    np.testing.assert_array_equal(np.array(hi), np.array(hi_whole))


def test_a_request_without_state_ignores_the_garbage_in_its_block():
    conv = make_conv([3, 2], [False, False], seed=5)
    delta = make_delta([3, 2], [False, False], seed=5)
    for pages in (conv.pages, delta.lo, delta.hi):
        pages[:] = np.where(np.arange(pages.shape[1]) % 2, np.nan, 1e30).astype(np.float32)
    y, lo = short_conv(*conv.args())
    want_y, want_lo = conv.expected()
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, conv.pages)
    y, lo, hi = gated_delta(*delta.args())
    want_y, want_lo, want_hi = delta.expected()
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, delta.lo)
    assert_pages(hi, want_hi, delta.hi)


def test_blocks_and_gaps_the_batch_does_not_own_keep_their_bits():
    case = make_delta([4, 1], [True, True], num_blocks=9, seed=6)
    y, lo, hi = gated_delta(*case.args())
    got_lo = np.array(lo)
    others = [b for b in range(9) if b not in case.slots]
    assert np.isnan(got_lo[others]).all() and np.isnan(np.array(hi)[others]).all()
    # Within an owned block: the conv state's room before ssm_offset and the tail.
    assert np.isnan(got_lo[case.slots, :case.ssm_offset]).all()
    assert np.isnan(got_lo[case.slots, -5:]).all()


@pytest.mark.parametrize("heads_in_lo", [0, 1, 3, 4])
def test_heads_split_between_lo_and_hi(heads_in_lo):
    case = make_delta(**MIXED, heads_in_lo=heads_in_lo, seed=7)
    y, lo, hi = gated_delta(*case.args())
    want_y, want_lo, want_hi = case.expected()
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)


def test_a_request_without_rows_keeps_or_clears_its_state():
    # As the references: a request with no rows this step still leaves its state
    # (zeros when it starts fresh).
    lengths, has_state = [2, 0, 0], [True, True, False]
    conv = make_conv(lengths, has_state, seed=8)
    y, lo = short_conv(*conv.args())
    assert_pages(lo, conv.expected()[1], conv.pages)
    delta = make_delta(lengths, has_state, seed=8)
    _, lo, hi = gated_delta(*delta.args())
    _, want_lo, want_hi = delta.expected()
    assert_pages(lo, want_lo, delta.lo)
    assert_pages(hi, want_hi, delta.hi)


def test_the_pages_are_written_in_place():
    case = make_conv([4, 1], [True, True], seed=9)
    _, _, lo_given, slots, cu, has_state = case.args()
    y, lo = short_conv(case.x, case.weight, lo_given, slots, cu, has_state)
    mx.eval(y, lo)
    np.testing.assert_array_equal(np.array(lo_given), np.array(lo))
    delta = make_delta([4, 1], [True, True], seed=9)
    args = list(delta.args())
    y, lo, hi = gated_delta(*args)
    mx.eval(y, lo, hi)
    np.testing.assert_array_equal(np.array(args[5]), np.array(lo))
    np.testing.assert_array_equal(np.array(args[6]), np.array(hi))


def test_strided_pages_give_the_same_result():
    case = make_delta([3, 2], [True, False], seed=10)
    args = list(case.args())
    args[5] = mx.transpose(mx.array(np.ascontiguousarray(case.lo.T)))  # a column-major view
    y, lo, hi = gated_delta(*args)
    want_y, want_lo, want_hi = case.expected()
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, case.lo)


def test_mixed_input_dtypes():
    case = make_delta([4, 2], [True, True], seed=11)
    dtypes = [mx.float32, mx.float16, mx.bfloat16, mx.bfloat16, mx.float16]
    case.inputs = tuple(a.astype(d) for a, d in zip(case.inputs, dtypes))
    case.inputs64 = tuple(np.array(a.astype(mx.float32), np.float64) for a in case.inputs)
    y, lo, hi = gated_delta(*case.args())
    want_y, want_lo, want_hi = case.expected()
    assert y.dtype == mx.float32
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, case.lo)
    assert_pages(hi, want_hi, case.hi)


@pytest.mark.parametrize("mode", [True, False], ids=["delta_rule", "linear"])
@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("dk", [128, 40])
def test_every_instruction_set(isa, dk, mode):
    # Dk 128 takes the fixed-width body; 40 leaves a tail after the 16-lane chunks.
    delta = make_delta([6, 1], [False, True], hk=1, hv=2, dk=dk, dv=24, seed=12, delta=mode)
    conv = make_conv([6, 1], [False, True], channels=100, seed=12)
    with cpu_isa(isa):
        y, lo, hi = gated_delta(*delta.args(), delta=mode)
        yc, loc = short_conv(*conv.args())
        mx.eval(y, lo, hi, yc, loc)
    want_y, want_lo, want_hi = delta.expected()
    assert_rows(y, want_y, mx.float32)
    assert_pages(lo, want_lo, delta.lo)
    assert_pages(hi, want_hi, delta.hi)
    want_yc, want_loc = conv.expected()
    assert_rows(yc, want_yc, mx.float32)
    assert_pages(loc, want_loc, conv.pages)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
def test_short_conv_at_an_offset(dtype):
    case = make_conv(**MIXED, dtype=dtype, conv_offset=37, seed=13)
    y, lo = short_conv(*case.args(), case.conv_offset)
    want_y, want_lo = case.expected()
    assert_rows(y, want_y, dtype)
    assert_pages(lo, want_lo, case.pages)
    ref_y, ref_lo = short_conv_pages_ref(*case.args(), conv_offset=case.conv_offset)
    assert_rows(y, np.array(ref_y.astype(mx.float32), np.float64), dtype)
    assert_pages(lo, np.array(ref_lo, np.float64), case.pages)


def test_a_layer_step_shares_one_page():
    """A mixer with two convs and the recurrent states, in one K/V block placed as the
    runner places them: no op touches another's floats."""
    from vllm_metal.attention.caches.state_pages import GdnStateShape

    hk, hv, dk, dv, taps, lengths, has_state = 1, 2, 32, 16, 4, [5, 1], [True, True]
    shape = GdnStateShape(taps, (2 * hk * dk, hv * dv), hv, dv, dk)
    width = shape.ssm_offset + shape.head_floats + 8  # one head in lo, one in hi
    assert shape.fits(width) and shape.heads_in_lo(width) == 1
    delta = make_delta(lengths, has_state, hk=hk, hv=hv, dk=dk, dv=dv, seed=14)
    convs = [make_conv(lengths, has_state, channels=c, taps=taps, seed=15 + i,
                       conv_offset=shape.conv_offset(i)) for i, c in enumerate(shape.conv_dims)]
    rng = np.random.default_rng(16)
    lo = np.full((delta.lo.shape[0], width), np.nan, np.float32)
    hi = np.full((delta.lo.shape[0], width), np.nan, np.float32)
    for slot in delta.slots:
        lo[slot, :shape.conv_floats] = rng.normal(size=shape.conv_floats)
        lo[slot, shape.ssm_offset:shape.ssm_offset + shape.head_floats] = rng.normal(
            size=shape.head_floats) * 0.5
        hi[slot, :shape.head_floats] = rng.normal(size=shape.head_floats) * 0.5
    for conv in convs:
        conv.pages, conv.slots = lo, delta.slots
    delta.lo, delta.hi, delta.ssm_offset, delta.heads_in_lo = lo, hi, shape.ssm_offset, 1
    want_y, want_lo, want_hi = delta.expected()
    slots, cu, keep = _batch_arrays(delta.slots, lengths, has_state)
    page = mx.array(lo)
    for conv in convs:
        want_conv_y, want_conv_lo = conv.expected()
        held = np.s_[:, conv.conv_offset:conv.conv_offset + conv.x.shape[1] * (taps - 1)]
        want_lo[held] = want_conv_lo[held]
        conv_y, page = short_conv(conv.x, conv.weight, page, slots, cu, keep, conv.conv_offset)
        assert_rows(conv_y, want_conv_y, mx.float32)
    y, page, hi_out = gated_delta(*delta.inputs, page, mx.array(hi), slots, cu, keep,
                                  shape.ssm_offset, 1)
    assert_rows(y, want_y, mx.float32)
    assert_pages(page, want_lo, lo)
    assert_pages(hi_out, want_hi, hi)


def _conv_args(**change):
    case = make_conv([3, 1], [True, True], seed=14)
    args = dict(zip(["x", "weight", "lo", "slots", "cu_seqlens", "has_state"], case.args()))
    args.update(change)
    return args


def _delta_args(**change):
    case = make_delta([3, 1], [True, True], seed=15)
    names = ["q", "k", "v", "g", "beta", "lo", "hi", "slots", "cu_seqlens", "has_state",
             "ssm_offset", "heads_in_lo"]
    args = dict(zip(names, case.args()))
    args.update(change)
    return args


@pytest.mark.parametrize("change,match", [
    (dict(x=mx.zeros((4, 24), dtype=mx.int32)), "x must be float16, bfloat16 or float32"),
    (dict(x=mx.zeros((4, 24, 1))), r"x must be \[T, C\]"),
    (dict(weight=mx.zeros((23, 4))), r"weight must be \[C, K\]"),
    (dict(lo=mx.zeros((6, 100), dtype=mx.float16)), "lo must be float32"),
    (dict(lo=mx.zeros((6, 71))), r"\(K - 1\) \* C = 72 at conv_offset 0"),
    (dict(conv_offset=14), "cannot hold the conv state of .* at conv_offset 14"),
    (dict(conv_offset=-1), "conv_offset must be >= 0"),
    (dict(slots=mx.zeros((2,), dtype=mx.float32)), "slots must be integer"),
    (dict(cu_seqlens=mx.array([0, 4], dtype=mx.int32)), r"cu_seqlens must be integer \[N \+ 1\]"),
    (dict(has_state=mx.ones((2,), dtype=mx.float32)), "has_state must be bool or integer"),
])
def test_short_conv_bad_arguments_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        short_conv(**_conv_args(**change))


@pytest.mark.parametrize("change,match", [
    (dict(q=mx.zeros((4, 2, 32), dtype=mx.int8)), "q must be float16, bfloat16 or float32"),
    (dict(k=mx.zeros((4, 2, 16))), r"k must be \[T, Hk, Dk\] like q"),
    (dict(v=mx.zeros((3, 4, 16))), r"v must be \[T, Hv, Dv\] with q's T"),
    (dict(v=mx.zeros((4, 3, 16)), g=mx.zeros((4, 3)), beta=mx.zeros((4, 3))),
     "Hv = 3 heads must be a multiple of q's Hk = 2"),
    (dict(g=mx.zeros((4, 4, 16))), r"g must be \[T, Hv\] or \[T, Hv, Dk\]"),
    (dict(beta=mx.zeros((4, 4), dtype=mx.uint8)), "beta must be float16, bfloat16 or float32"),
    (dict(hi=mx.zeros((3, 1024))), "lo and hi must have the same num_blocks"),
    (dict(hi=mx.zeros((5, 1023))), "hi's rows of W = 1023 floats cannot hold"),
    (dict(ssm_offset=60), "lo's rows of W = 1077 floats cannot hold 2 head states"),
    (dict(heads_in_lo=5), r"heads_in_lo must be in \[0, Hv\]"),
    (dict(ssm_offset=-1), "ssm_offset must be >= 0"),
    (dict(lo=mx.zeros((5, 1077), dtype=mx.bfloat16)), "lo must be float32"),
])
def test_gated_delta_bad_arguments_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        gated_delta(**_delta_args(**change))


@pytest.mark.parametrize("change,match", [
    (dict(slots=mx.array([1, 9], dtype=mx.int32)), "slot 9 of request 1 is outside"),
    (dict(slots=mx.array([-1, 2], dtype=mx.int32)), "slot -1 of request 0 is outside"),
    (dict(slots=mx.array([2, 2], dtype=mx.int32)), "slot 2 is named by two requests"),
    (dict(cu_seqlens=mx.array([0, 3, 3], dtype=mx.int32)), "cu_seqlens must start at 0 and end"),
    (dict(cu_seqlens=mx.array([0, 5, 4], dtype=mx.int32)), "cu_seqlens must not decrease"),
])
def test_bad_batch_data_raises_at_evaluation_before_writing(change, match):
    conv = _conv_args(**change)
    before = np.array(conv["lo"])
    y, lo = short_conv(**conv)
    with pytest.raises((IndexError, ValueError, RuntimeError), match=match):
        mx.eval(y, lo)
    assert np.array(conv["lo"]).tobytes() == before.tobytes()
    delta = _delta_args(**change)
    out = gated_delta(**delta)
    with pytest.raises((IndexError, ValueError, RuntimeError), match=match):
        mx.eval(*out)
