"""Key pages as columns (``key_columns=True``, the CPU backend's layout for float
caches): key_cache [num_blocks, num_kv_heads, head_size, block_size], value_cache
rows as before. Held to the numpy float64 oracle over the same keys stored as rows,
and to the row layout's own writes; batch invariance is in
test_attention_invariance.py (its ``layout`` parameter)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.attention_np import paged_attention_np, reshape_and_cache_np
from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import (TOLERANCE, PagedBatch, as_key_columns, as_numpy, forced,
                                    make_batch)
from vllm_metal import ops
from vllm_metal.ops.reference import (key_columns_as_rows, paged_attention_ref,
                                      reshape_and_cache_ref, rows_as_key_columns)


def expected(batch: PagedBatch, **options) -> np.ndarray:
    """float64 attention over the row-layout batch (numpy oracle)."""
    sinks = options.get("sinks")
    return paged_attention_np(
        as_numpy(batch.query).astype(np.float64), as_numpy(batch.key_cache).astype(np.float64),
        as_numpy(batch.value_cache).astype(np.float64), np.array(batch.block_tables),
        np.array(batch.seq_lens), np.array(batch.cu_seqlens_q), batch.scale,
        options.get("sliding_window"), options.get("softcap"),
        None if sinks is None else np.array(sinks, dtype=np.float64))


def check(batch: PagedBatch, dtype=mx.float32, **options) -> None:
    got = ops.paged_attention(*as_key_columns(batch).args(), key_columns=True, **options)
    assert got.dtype == batch.query.dtype
    np.testing.assert_allclose(as_numpy(got), expected(batch, **options), rtol=0,
                               atol=TOLERANCE[dtype])


# (seq_lens, q_lens, num_heads, num_kv_heads): decode rows and prefill chunks;
# groups of 1, 3, 8 and 12 (more than one block of heads per column load).
SHAPES = [
    ([1, 16, 100, 70], [1, 16, 1, 9], 6, 2),
    ([130, 33, 300], [1, 1, 1], 9, 3),
    ([77, 200], [77, 5], 8, 8),
    ([260, 90], [3, 1], 24, 2),
]


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[2]}x{s[3]}")
def test_attention_over_key_columns(isa, head_size, shape):
    seq_lens, q_lens, heads, kv_heads = shape
    # Pages of 16 and 32 (whole vectors), 8 (half an AVX-512 vector) and 24
    # (vectors that straddle pages): the last two read through staged copies.
    for block_size in (16, 32, 8, 24):
        batch = make_batch(seq_lens, q_lens, num_heads=heads, num_kv_heads=kv_heads,
                           head_size=head_size, block_size=block_size, seed=head_size + block_size)
        with cpu_isa(isa):
            check(batch)
            with forced("SplitKv", 37):
                check(batch)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("options", [{"sliding_window": 50}, {"softcap": 4.0},
                                     {"sinks": "per-head"}],
                         ids=["window", "softcap", "sinks"])
def test_half_precision_caches_and_options(dtype, options):
    batch = make_batch([300, 41, 129], [7, 1, 1], num_heads=8, num_kv_heads=2, head_size=128,
                       block_size=16, dtype=dtype, seed=11)
    if options.get("sinks") == "per-head":
        options = {"sinks": mx.array([float(h % 5) - 2 for h in range(8)])}
    check(batch, dtype, **options)
    with forced("GqaDecode", 64):
        check(make_batch([300, 41], [1, 1], num_heads=8, num_kv_heads=2, head_size=128,
                         dtype=dtype, seed=12), dtype, **options)


def test_the_pure_mlx_reference_agrees():
    batch = make_batch([90, 33], [4, 1], num_heads=4, num_kv_heads=2, head_size=64, seed=9)
    col = as_key_columns(batch)
    np.testing.assert_array_equal(as_numpy(key_columns_as_rows(col.key_cache)),
                                  as_numpy(batch.key_cache))
    want = paged_attention_ref(*col.args(), key_columns=True)
    np.testing.assert_allclose(as_numpy(want), expected(batch), rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [16, 8, 24])
def test_reshape_and_cache_writes_key_columns(dtype, block_size):
    rng = np.random.default_rng(block_size)
    blocks, heads, d = 5, 3, 64
    key = rng.standard_normal((9, heads, d)).astype(np.float32)
    value = rng.standard_normal((9, heads, d)).astype(np.float32)
    slots = rng.choice(blocks * block_size, 9, replace=False).astype(np.int32)
    slots[4] = -1  # padding: skipped
    rows = rng.standard_normal((blocks, block_size, heads, d)).astype(np.float32)
    vrows = rng.standard_normal((blocks, block_size, heads, d)).astype(np.float32)
    kc, vc = ops.reshape_and_cache(
        mx.array(key), mx.array(value), rows_as_key_columns(mx.array(rows).astype(dtype)),
        mx.array(vrows).astype(dtype), mx.array(slots), key_columns=True)
    want_k, want_v = reshape_and_cache_np(key, value, rows, vrows, slots)
    assert kc.shape == (blocks, heads, d, block_size)
    np.testing.assert_array_equal(as_numpy(kc), as_numpy(
        rows_as_key_columns(mx.array(want_k).astype(dtype))))
    np.testing.assert_array_equal(as_numpy(vc), as_numpy(mx.array(want_v).astype(dtype)))
    ref_k, ref_v = reshape_and_cache_ref(
        mx.array(key), mx.array(value), rows_as_key_columns(mx.array(rows).astype(dtype)),
        mx.array(vrows).astype(dtype), mx.array(slots), key_columns=True)
    np.testing.assert_array_equal(as_numpy(ref_k), as_numpy(kc))
    np.testing.assert_array_equal(as_numpy(ref_v), as_numpy(vc))


def test_write_then_attend_equals_the_row_layout():
    # The same tokens written through the op into both layouts: attention over
    # them agrees with the oracle over the rows, and a slot past the cache raises
    # before anything is written.
    batch = make_batch([70, 20], [70, 20], num_heads=6, num_kv_heads=3, head_size=64, seed=2)
    n = 90
    rng = np.random.default_rng(0)
    key = mx.array(rng.standard_normal((n, 3, 64)).astype(np.float32))
    value = mx.array(rng.standard_normal((n, 3, 64)).astype(np.float32))
    tables = np.array(batch.block_tables)
    slots = np.array([tables[0, t // 16] * 16 + t % 16 for t in range(70)]
                     + [tables[1, t // 16] * 16 + t % 16 for t in range(20)], np.int32)
    kc_rows, vc_rows = ops.reshape_and_cache(key, value, batch.key_cache, batch.value_cache,
                                             mx.array(slots))
    kc_cols, vc_cols = ops.reshape_and_cache(key, value, rows_as_key_columns(batch.key_cache),
                                             mx.array(np.array(batch.value_cache)),
                                             mx.array(slots), key_columns=True)
    rows = PagedBatch(batch.query, kc_rows, vc_rows, *batch.args()[3:])
    got = ops.paged_attention(batch.query, kc_cols, vc_cols, *batch.args()[3:], key_columns=True)
    np.testing.assert_allclose(as_numpy(got), expected(rows), rtol=0, atol=2e-5)
    bad = mx.array(np.array([kc_cols.shape[0] * 16], np.int32))
    before = np.array(kc_cols)
    with pytest.raises(RuntimeError, match="outside the cache"):
        mx.eval(*ops.reshape_and_cache(key[:1], value[:1], kc_cols, vc_cols, bad,
                                       key_columns=True))
    np.testing.assert_array_equal(np.array(kc_cols), before)


def test_key_columns_are_validated():
    batch = make_batch([8], [1], head_size=64)
    col = as_key_columns(batch)
    args = col.args()[3:]
    with pytest.raises(ValueError, match="float caches only"):
        ops.paged_attention(batch.query, col.key_cache, col.value_cache, *args,
                            kv_quant="int8", key_columns=True)
    with pytest.raises(ValueError, match="must match key_cache shape"):
        # Rows passed as columns: the block size and heads disagree with the values.
        ops.paged_attention(*batch.args(), key_columns=True)
    odd = make_batch([8], [1], head_size=80)
    with pytest.raises(ValueError, match="key columns take head sizes"):
        ops.paged_attention(*as_key_columns(odd).args(), key_columns=True)
    with pytest.raises(ValueError, match="key columns take head sizes"):
        ops.reshape_and_cache(mx.zeros((1, 2, 80)), mx.zeros((1, 2, 80)),
                              as_key_columns(odd).key_cache, odd.value_cache, mx.array([0]),
                              key_columns=True)
