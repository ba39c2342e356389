"""vllm_metal.ops.paged_attention against the pure-MLX reference and a numpy
float64 oracle, one test per edge case."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.attention_np import paged_attention_np
from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import as_numpy, assert_close, make_batch
from vllm_metal import ops
from vllm_metal.ops.reference import paged_attention_ref


def check(batch, dtype=mx.float32, **options):
    out = ops.paged_attention(*batch.args(), **options)
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    assert_close(out, paged_attention_ref(*batch.args(), **options), dtype)
    return out


def test_single_token_decode():
    check(make_batch([37], [1]))


def test_prefill_of_whole_prompt():
    check(make_batch([45], [45]))


def test_chunked_prefill_continuation():
    # 30 tokens already cached, the next chunk of 20 attends to all of them.
    check(make_batch([50], [20]))


def test_mixed_batch_of_prefills_and_decodes():
    check(make_batch([1, 64, 200, 17, 90, 33], [1, 64, 1, 5, 1, 33], num_heads=6,
                     num_kv_heads=2))


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_block_boundaries(block_size):
    b = block_size
    seq_lens = [b - 1, b, b + 1, 2 * b, 2 * b + 1, 3 * b - 1]
    q_lens = [b - 1, 1, 2, b + 1, 1, b]  # chunks that start and end across page edges
    check(make_batch(seq_lens, q_lens, block_size=b))


def test_long_context():
    check(make_batch([2100, 2345], [1, 7], num_heads=8, num_kv_heads=2))


def test_long_single_sequence_decode_split_over_partitions():
    # One sequence, one KV head: too little work per thread, so the CPU kernel
    # splits the context into PARTITION_SIZE pieces and merges them.
    check(make_batch([3 * 512 + 77], [1], num_heads=8, num_kv_heads=1))
    check(make_batch([3 * 512 + 77], [3], num_heads=8, num_kv_heads=1, head_size=128))


@pytest.mark.parametrize("window", [1, 7, 64, 10_000])
def test_sliding_window(window):
    check(make_batch([100, 40, 1], [30, 1, 1]), sliding_window=window)


def test_sliding_window_with_long_context_split():
    check(make_batch([1500], [2], num_heads=4, num_kv_heads=1), sliding_window=700)


def test_softcap():
    # Large queries so the cap actually bends the scores.
    batch = make_batch([80, 20], [10, 1])
    batch.query = batch.query * 8
    check(batch, softcap=5.0)


def test_sinks():
    sinks = mx.array([-2.0, 0.0, 1.5, 4.0])
    check(make_batch([70, 25], [5, 1]), sinks=sinks)


def test_sinks_dominating_give_small_but_finite_output():
    sinks = mx.full((4,), 30.0)
    out = check(make_batch([12], [1]), sinks=sinks)
    assert np.abs(as_numpy(out)).max() < 1e-6


def test_all_options_together():
    sinks = mx.array([0.5, -1.0, 2.0, 0.0, 1.0, -0.5])
    check(make_batch([150, 60, 9], [40, 1, 9], num_heads=6, num_kv_heads=3),
          sliding_window=32, softcap=8.0, sinks=sinks)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_dtypes(dtype):
    check(make_batch([120, 31], [17, 1], dtype=dtype), dtype)


def test_query_dtype_differs_from_cache_dtype():
    batch = make_batch([60, 9], [4, 1], dtype=mx.bfloat16, query_dtype=mx.float32)
    out = check(batch, mx.float32)
    assert out.dtype == mx.float32


@pytest.mark.parametrize("head_size", [64, 128, 256, 80, 33])
def test_head_sizes(head_size):
    check(make_batch([70, 18], [6, 1], head_size=head_size))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 2), (16, 2), (8, 1)])
def test_gqa_ratios_and_mqa(num_heads, num_kv_heads):
    check(make_batch([90, 13], [9, 1], num_heads=num_heads, num_kv_heads=num_kv_heads))


@pytest.mark.parametrize("block_size", [8, 16, 32, 5, 1])
def test_block_sizes(block_size):
    check(make_batch([73, 8], [11, 1], block_size=block_size))


def test_non_contiguous_block_tables():
    # Same logical content in sequential and shuffled physical pages: same output.
    kwargs = dict(seq_lens=[77, 150, 5], q_lens=[3, 150, 1], seed=3)
    ordered = make_batch(**kwargs, shuffle=False)
    shuffled = make_batch(**kwargs, shuffle=True)
    out_ordered = ops.paged_attention(*ordered.args())
    out_shuffled = ops.paged_attention(*shuffled.args())
    np.testing.assert_array_equal(np.array(out_ordered), np.array(out_shuffled))
    check(shuffled)


def test_total_q_zero():
    batch = make_batch([], [])
    out = ops.paged_attention(*batch.args())
    assert out.shape == (0, 4, 64)
    mx.eval(out)


def test_sequences_with_no_query_rows():
    batch = make_batch([40, 12, 30], [0, 3, 0])
    check(batch)
    idle = make_batch([40, 12], [0, 0])
    assert ops.paged_attention(*idle.args()).shape == (0, 4, 64)


def test_int64_metadata_is_accepted():
    batch = make_batch([50, 7], [5, 1])
    expected = ops.paged_attention(*batch.args())
    batch.block_tables = batch.block_tables.astype(mx.int64)
    batch.seq_lens = batch.seq_lens.astype(mx.int64)
    batch.cu_seqlens_q = batch.cu_seqlens_q.astype(mx.int64)
    np.testing.assert_array_equal(np.array(ops.paged_attention(*batch.args())),
                                  np.array(expected))


def test_non_contiguous_query_view():
    batch = make_batch([33, 20], [6, 2])
    expected = ops.paged_attention(*batch.args())
    # The same values as a strided view: the first half of each wider row.
    wide = mx.concatenate([batch.query, mx.zeros_like(batch.query)], axis=-1)
    mx.eval(wide)
    batch.query = wide[..., : batch.query.shape[-1]]
    assert_close(ops.paged_attention(*batch.args()), expected, mx.float32)


def test_strided_and_offset_cache_views():
    batch = make_batch([70, 10], [8, 1], seed=4)
    expected = ops.paged_attention(*batch.args())
    # Same values as a transposed (strided) view and as a view at an offset
    # inside a larger allocation.
    swapped = mx.swapaxes(mx.swapaxes(batch.key_cache, 1, 2) * 1, 1, 2)
    stacked = mx.stack([batch.value_cache, batch.value_cache])
    mx.eval(swapped, stacked)
    offset_view = stacked[1:].reshape(batch.value_cache.shape)
    batch.key_cache, batch.value_cache = swapped, offset_view
    np.testing.assert_array_equal(np.array(ops.paged_attention(*batch.args())),
                                  np.array(expected))


def test_against_numpy_float64_oracle():
    batch = make_batch([130, 40, 3, 64], [20, 1, 3, 2], num_heads=6, num_kv_heads=2,
                       head_size=64, block_size=16, dtype=mx.float16)
    sinks = mx.array([0.1, -0.3, 1.0, 0.0, 2.0, -1.0])
    options = dict(sliding_window=50, softcap=20.0)
    out = ops.paged_attention(*batch.args(), sinks=sinks, **options)
    expected = paged_attention_np(
        *(as_numpy(a) for a in batch.args()[:6]), batch.scale, sinks=as_numpy(sinks),
        **options)
    assert_close(out, expected, mx.float16)
    plain = ops.paged_attention(*batch.args())
    assert_close(plain, paged_attention_np(*(as_numpy(a) for a in batch.args()[:6]),
                                           batch.scale), mx.float16)


def test_stays_lazy_and_composes_under_compile():
    batch = make_batch([40, 9], [4, 1])

    def attend(q):
        return ops.paged_attention(q * 2, *batch.args()[1:]) + 1

    expected = paged_attention_ref(batch.query * 2, *batch.args()[1:]) + 1
    assert_close(mx.compile(attend)(batch.query), expected, mx.float32)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_every_cpu_isa_variant(isa, dtype):
    with cpu_isa(isa):
        for head_size in (64, 128, 40):
            batch = make_batch([90, 20], [12, 1], head_size=head_size, dtype=dtype, seed=7)
            check(batch, dtype, sliding_window=50, softcap=15.0)
