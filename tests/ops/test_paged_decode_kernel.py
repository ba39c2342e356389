"""The CPU decode kernels against the pure-MLX reference, one test per edge case: every
ISA variant (the x86 pieces kernel for head sizes 64/128/256, the portable single-row
kernel otherwise), GQA groups that fill, split and overflow its register blocks, page
runs that start and end mid-page, pieces merged across threads, and the options.

Decode rows reach these kernels through every route (GqaDecode cuts a sequence's keys
among threads); caches from make_batch are NaN-poisoned wherever a correct kernel must
not read.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.attention_np import paged_attention_np
from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import as_numpy, assert_close, forced, make_batch
from vllm_metal import ops
from vllm_metal.ops.reference import paged_attention_ref


def check(batch, dtype=mx.float32, **options):
    out = ops.paged_attention(*batch.args(), **options)
    assert_close(out, paged_attention_ref(*batch.args(), **options), dtype)
    return out


def decode_batch(seq_lens, **kwargs):
    return make_batch(seq_lens, [1] * len(seq_lens), **kwargs)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("head_size", [64, 128, 256, 80])
def test_every_isa_dtype_and_head_size(isa, dtype, head_size):
    # 37-key pieces start and end inside 16-key pages; 1 and 16 keys are a lone
    # key and exactly one page.
    batch = decode_batch([1, 16, 100, 333], num_heads=6, num_kv_heads=2, head_size=head_size, dtype=dtype,
                         seed=head_size)
    with cpu_isa(isa):
        with forced("GqaDecode", 37):
            check(batch, dtype)
        check(batch, dtype)  # the decision's own pieces


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (14, 2), (16, 2), (12, 1)],
                         ids=["mha", "group3", "group7", "group8", "group12"])
@pytest.mark.parametrize("head_size", [64, 128])
def test_gqa_groups_across_the_register_blocks(isa, num_heads, num_kv_heads, head_size):
    # The value pass keeps a block of heads' accumulators in registers (6 heads
    # of 64 or 3 of 128 on AVX-512, 3 on AVX2): groups that fit, fill, and leave
    # a remainder after one or more full blocks.
    batch = decode_batch([70, 260], num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, seed=5)
    with cpu_isa(isa):
        check(batch)


def test_group_larger_than_one_pass_of_the_kernel():
    # 40 query heads on one KV head: more than the 32 heads handled per pass.
    check(decode_batch([50, 300], num_heads=40, num_kv_heads=1, head_size=64))


@pytest.mark.parametrize("block_size", [1, 5, 8, 16, 32])
def test_block_sizes(block_size):
    with forced("GqaDecode", 29):
        check(decode_batch([1, 31, 257], num_heads=9, num_kv_heads=3, block_size=block_size))


@pytest.mark.parametrize("partition", [1, 16, 64, 4096])
def test_pieces_merge_to_the_same_answer(partition):
    # From one key per piece (300 pieces merged) to a single piece.
    batch = decode_batch([300, 45], num_heads=9, num_kv_heads=3, seed=2)
    with forced("GqaDecode", partition):
        out = check(batch)
    np.testing.assert_allclose(as_numpy(out), as_numpy(ops.paged_attention(*batch.args())), rtol=0, atol=2e-5)


@pytest.mark.parametrize("window", [1, 15, 16, 17, 45, 5000])
def test_sliding_window_starts_on_and_off_a_page(window):
    batch = decode_batch([40, 300, 1000], num_heads=9, num_kv_heads=3)
    check(batch, sliding_window=window)
    with forced("GqaDecode", 50):
        check(batch, sliding_window=window)


def test_softcap_and_sinks_with_merged_pieces():
    batch = decode_batch([7, 600], num_heads=8, num_kv_heads=2)
    batch.query = batch.query * 6  # large scores, so the cap bends them
    sinks = mx.array([float(h % 5) - 2 for h in range(8)])
    with forced("GqaDecode", 100):
        out = ops.paged_attention(*batch.args(), softcap=5.0, sinks=sinks)
    expected = paged_attention_np(*(as_numpy(a) for a in batch.args()[:6]), batch.scale, softcap=5.0,
                                  sinks=as_numpy(sinks))
    assert_close(out, expected, mx.float32)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
def test_decode_rows_inside_varlen_and_split_kv_items(isa):
    # Mixed batches send their decode rows to the single-row kernel as well.
    batch = make_batch([300, 90, 1, 700], [1, 30, 1, 1], num_heads=9, num_kv_heads=3, seed=9)
    with cpu_isa(isa):
        for route in ("Varlen", "SplitKv"):
            with forced(route, 128):
                check(batch, sliding_window=200)


def test_bad_block_id_in_a_decode_piece_raises_at_eval():
    batch = decode_batch([100], num_heads=9, num_kv_heads=3)
    table = np.array(batch.block_tables)
    table[0, 3] = 10_000
    batch.block_tables = mx.array(table)
    with forced("GqaDecode", 32), pytest.raises(RuntimeError, match="block_tables entry 10000"):
        mx.eval(ops.paged_attention(*batch.args()))


def test_results_do_not_depend_on_the_thread_interleaving():
    # Pieces finish in any order; the last one merges. Same inputs, same bits.
    batch = decode_batch([999, 1000, 3], num_heads=9, num_kv_heads=3, seed=11)
    with forced("GqaDecode", 64):
        first = np.array(ops.paged_attention(*batch.args()))
        for _ in range(5):
            np.testing.assert_array_equal(np.array(ops.paged_attention(*batch.args())), first)
