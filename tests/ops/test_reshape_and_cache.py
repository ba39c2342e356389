"""vllm_metal.ops.reshape_and_cache: slot writes, padding, in-place update."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.attention_np import reshape_and_cache_np
from tests.ops.paged_inputs import as_numpy, assert_close, make_batch
from vllm_metal import ops
from vllm_metal.native import get_ops
from vllm_metal.ops.reference import paged_attention_ref, reshape_and_cache_ref

NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_SIZE = 6, 8, 2, 32


def caches(dtype=mx.float32, seed=0):
    rng = np.random.default_rng(seed)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    k = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    v = mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    mx.eval(k, v)
    return k, v


def rows(n, dtype=mx.float32, seed=1):
    rng = np.random.default_rng(seed)
    k = mx.array(rng.standard_normal((n, KV_HEADS, HEAD_SIZE)).astype(np.float32)).astype(dtype)
    v = mx.array(rng.standard_normal((n, KV_HEADS, HEAD_SIZE)).astype(np.float32)).astype(dtype)
    return k, v


def check(key, value, key_cache, value_cache, slots):
    expected_np = reshape_and_cache_np(as_numpy(key.astype(key_cache.dtype)),
                                       as_numpy(value.astype(key_cache.dtype)),
                                       as_numpy(key_cache), as_numpy(value_cache),
                                       as_numpy(slots))
    expected_ref = reshape_and_cache_ref(key, value, key_cache, value_cache, slots)
    mx.eval(expected_ref)
    out_k, out_v = ops.reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert out_k.dtype == key_cache.dtype and out_k.shape == key_cache.shape
    for out, ref, oracle in zip((out_k, out_v), expected_ref, expected_np):
        np.testing.assert_array_equal(as_numpy(out), as_numpy(ref))
        np.testing.assert_array_equal(as_numpy(out), oracle)
    return out_k, out_v


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_writes_rows_at_their_slots(dtype):
    key_cache, value_cache = caches(dtype)
    key, value = rows(5, dtype)
    # Slots across pages, including both ends of the cache.
    check(key, value, key_cache, value_cache, mx.array([0, 7, 8, 29, 47], dtype=mx.int32))


def test_padding_slots_are_skipped():
    key_cache, value_cache = caches()
    before = as_numpy(key_cache)
    key, value = rows(4)
    out_k, _ = check(key, value, key_cache, value_cache, mx.array([-1, 3, -1, 12]))
    changed = np.argwhere((as_numpy(out_k) != before).any(axis=(2, 3)))
    assert changed.tolist() == [[0, 3], [1, 4]]  # slots 3 and 12 only


def test_int64_slot_mapping():
    key_cache, value_cache = caches()
    key, value = rows(3)
    check(key, value, key_cache, value_cache, mx.array([5, 40, 2], dtype=mx.int64))


def test_key_is_cast_to_cache_dtype():
    key_cache, value_cache = caches(mx.bfloat16)
    key, value = rows(3, mx.float32)
    check(key, value, key_cache, value_cache, mx.array([1, 2, 3]))


def test_non_contiguous_key_and_value_views():
    key_cache, value_cache = caches()
    key, value = rows(6)
    # Every other token: strided views.
    check(key[::2], value[::2], key_cache, value_cache, mx.array([10, 20, 30]))


def test_updates_the_cache_in_place_without_copying():
    ext = get_ops()
    key_cache, value_cache = caches()
    k_ptr, v_ptr = ext.data_ptr(key_cache), ext.data_ptr(value_cache)
    key, value = rows(2)
    out_k, out_v = ops.reshape_and_cache(key, value, key_cache, value_cache, mx.array([9, 33]))
    mx.eval(out_k, out_v)
    assert ext.data_ptr(out_k) == k_ptr and ext.data_ptr(out_v) == v_ptr
    # The caller's original arrays see the new rows too: same memory.
    np.testing.assert_array_equal(np.array(key_cache[1, 1]), np.array(key[0]))
    np.testing.assert_array_equal(np.array(value_cache[4, 1]), np.array(value[1]))


def test_is_lazy_until_evaluated():
    key_cache, value_cache = caches()
    before = np.array(key_cache[0, 0])
    key, value = rows(1)
    out_k, _ = ops.reshape_and_cache(key, value, key_cache, value_cache, mx.array([0]))
    np.testing.assert_array_equal(np.array(key_cache[0, 0]), before)  # nothing written yet
    mx.eval(out_k)
    np.testing.assert_array_equal(np.array(key_cache[0, 0]), np.array(key[0]))


def test_slot_out_of_range_raises_and_leaves_cache_intact():
    key_cache, value_cache = caches()
    before = as_numpy(key_cache)
    key, value = rows(2)
    out_k, out_v = ops.reshape_and_cache(key, value, key_cache, value_cache,
                                         mx.array([3, NUM_BLOCKS * BLOCK_SIZE]))
    with pytest.raises(RuntimeError, match="slot_mapping"):
        mx.eval(out_k, out_v)
    np.testing.assert_array_equal(as_numpy(key_cache), before)


def test_prefill_then_decode_reads_what_was_written():
    # Write a 20-token prompt, then one decode token, through the op; attention
    # over the returned caches must match the reference on the same data.
    batch = make_batch([21], [1], num_heads=4, num_kv_heads=2, head_size=32, block_size=8)
    key_cache = mx.zeros_like(batch.key_cache)
    value_cache = mx.zeros_like(batch.value_cache)
    table = batch.block_tables[0].tolist()
    rng = np.random.default_rng(5)
    k_all = mx.array(rng.standard_normal((21, 2, 32)).astype(np.float32))
    v_all = mx.array(rng.standard_normal((21, 2, 32)).astype(np.float32))
    slots = mx.array([table[t // 8] * 8 + t % 8 for t in range(21)])
    key_cache, value_cache = ops.reshape_and_cache(k_all[:20], v_all[:20], key_cache,
                                                   value_cache, slots[:20])
    key_cache, value_cache = ops.reshape_and_cache(k_all[20:], v_all[20:], key_cache,
                                                   value_cache, slots[20:])
    args = (batch.query, key_cache, value_cache, batch.block_tables, batch.seq_lens,
            batch.cu_seqlens_q, batch.scale)
    out = ops.paged_attention(*args)
    mx.eval(out)
    assert_close(out, paged_attention_ref(*args), mx.float32)


def test_cache_view_into_a_larger_buffer_is_updated_in_place():
    # Layer 1 of a [layers, ...] allocation: a row-contiguous view with an offset.
    rng = np.random.default_rng(2)
    layers = mx.array(rng.standard_normal((2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_SIZE))
                      .astype(np.float32))
    mx.eval(layers)
    key_cache = layers[1:].reshape(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    _, value_cache = caches()
    mx.eval(key_cache)
    key, value = rows(1)
    out_k, _ = ops.reshape_and_cache(key, value, key_cache, value_cache, mx.array([11]))
    mx.eval(out_k)
    assert get_ops().data_ptr(out_k) == get_ops().data_ptr(key_cache)
    np.testing.assert_array_equal(np.array(layers[1, 1, 3]), np.array(key[0]))


def test_strided_cache_gets_a_correct_copy():
    # A transposed view cannot be written in place; the result must still be right.
    rng = np.random.default_rng(3)
    base = mx.array(rng.standard_normal((NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, HEAD_SIZE))
                    .astype(np.float32))
    key_cache = mx.swapaxes(base, 1, 2)
    _, value_cache = caches()
    key, value = rows(2)
    check(key, value, key_cache, value_cache, mx.array([0, 45]))
