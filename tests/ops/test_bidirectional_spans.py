"""Rows that attend past their own position (``key_ends``: the image tokens of a
prefix-LM such as Gemma 3 see their whole image) on the CPU routes, held to the
numpy float64 oracle: spans inside a chunk, a span whose first rows are cached
context, spans in a sliding window, and every row outside a span unchanged."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.attention_np import paged_attention_np
from tests.ops.paged_inputs import (TOLERANCE, PagedBatch, as_key_columns, as_numpy, forced,
                                    make_batch)
from vllm_metal import ops
from vllm_metal.ops.reference import paged_attention_ref

# A chunk after 40 cached positions, a whole prompt, a decode row, a short prompt.
SEQ_LENS = [90, 40, 33, 7]
Q_LENS = [50, 40, 1, 7]
# (sequence, first position, last position): the first span begins in the cached
# context, so only its rows from position 40 are queries this step.
SPANS = [(0, 35, 52), (0, 70, 89), (1, 0, 15), (1, 20, 39), (3, 2, 4)]


def span_key_ends(seq_lens: list[int], q_lens: list[int], spans) -> mx.array:
    """int32 [total_q]: one past a span's last position for its rows, 0 elsewhere."""
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    ends = np.zeros(int(cu[-1]), np.int32)
    for seq, first, last in spans:
        start = seq_lens[seq] - q_lens[seq]
        for pos in range(max(first, start), last + 1):
            ends[cu[seq] + pos - start] = last + 1
    return mx.array(ends)


def oracle(batch: PagedBatch, key_ends: mx.array | None, **options) -> np.ndarray:
    return paged_attention_np(
        *(as_numpy(a) for a in batch.args()[:6]), batch.scale,
        sliding_window=options.get("sliding_window"),
        key_ends=None if key_ends is None else np.array(key_ends))


def batch_of(head_size: int, dtype=mx.float32, seed: int = 0) -> PagedBatch:
    return make_batch(SEQ_LENS, Q_LENS, num_heads=4, num_kv_heads=2, head_size=head_size,
                      block_size=16, dtype=dtype, seed=seed)


@pytest.mark.parametrize("route,partition", [("Varlen", 512), ("SplitKv", 32)])
@pytest.mark.parametrize("head_size", [64, 80])  # the pieces kernel; the tiled kernel
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_spans_see_their_whole_span(route, partition, head_size, dtype):
    batch = batch_of(head_size, dtype, seed=head_size)
    key_ends = span_key_ends(SEQ_LENS, Q_LENS, SPANS)
    with forced(route, partition):
        got = ops.paged_attention(*batch.args(), key_ends=key_ends)
    expected = oracle(batch, key_ends)
    np.testing.assert_allclose(as_numpy(got), expected, rtol=0, atol=TOLERANCE[dtype])
    # The spans did change something: causal attention differs on their rows.
    causal = oracle(batch, None)
    rows = np.array(key_ends) > 0
    assert np.abs(expected[rows] - causal[rows]).max() > 0.05
    np.testing.assert_array_equal(expected[~rows], causal[~rows])


def test_rows_outside_spans_are_bit_identical_to_causal():
    batch = batch_of(64, seed=3)
    key_ends = span_key_ends(SEQ_LENS, Q_LENS, SPANS)
    rows = np.array(key_ends) == 0
    got = np.array(ops.paged_attention(*batch.args(), key_ends=key_ends))
    plain = np.array(ops.paged_attention(*batch.args()))
    np.testing.assert_array_equal(got[rows], plain[rows])
    # key_ends of zeros (no span) is the causal op itself.
    zeros = mx.zeros_like(key_ends)
    np.testing.assert_array_equal(np.array(ops.paged_attention(*batch.args(), key_ends=zeros)),
                                  plain)


@pytest.mark.parametrize("window", [8, 24])
def test_sliding_window_still_counts_back_from_the_row(window):
    spans = [(0, 60, 67), (1, 4, 11), (3, 2, 4)]  # no longer than the window
    batch = batch_of(64, seed=window)
    key_ends = span_key_ends(SEQ_LENS, Q_LENS, spans)
    got = ops.paged_attention(*batch.args(), sliding_window=window, key_ends=key_ends)
    np.testing.assert_allclose(as_numpy(got), oracle(batch, key_ends, sliding_window=window),
                               rtol=0, atol=TOLERANCE[mx.float32])


def test_key_columns_and_the_mlx_reference_agree():
    batch = batch_of(64, seed=5)
    key_ends = span_key_ends(SEQ_LENS, Q_LENS, SPANS)
    got = ops.paged_attention(*as_key_columns(batch).args(), key_columns=True, key_ends=key_ends)
    np.testing.assert_allclose(as_numpy(got), oracle(batch, key_ends), rtol=0,
                               atol=TOLERANCE[mx.float32])
    ref = paged_attention_ref(*batch.args(), key_ends=key_ends)
    np.testing.assert_allclose(as_numpy(ref), oracle(batch, key_ends), rtol=0, atol=1e-5)


def test_a_sequence_alone_equals_it_in_the_batch():
    batch = batch_of(64, seed=7)
    key_ends = span_key_ends(SEQ_LENS, Q_LENS, SPANS)
    together = np.array(ops.paged_attention(*batch.args(), key_ends=key_ends))
    alone = PagedBatch(batch.query[:Q_LENS[0]], batch.key_cache, batch.value_cache,
                       batch.block_tables[:1], batch.seq_lens[:1], batch.cu_seqlens_q[:2],
                       batch.scale)
    own = np.array(ops.paged_attention(*alone.args(), key_ends=key_ends[:Q_LENS[0]]))
    np.testing.assert_array_equal(own, together[:Q_LENS[0]])


def test_key_ends_must_have_one_entry_per_row():
    batch = batch_of(64)
    with pytest.raises(ValueError, match="total_q"):
        ops.paged_attention(*batch.args(), key_ends=mx.zeros((3,), mx.int32))
    with pytest.raises(TypeError, match="int32"):
        ops.paged_attention(*batch.args(), key_ends=mx.zeros((98,), mx.float32))
