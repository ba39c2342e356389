"""reshape_and_cache (kernels_v2) on the MSL harness against the pure-MLX reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import DTYPE_NAMES, raw, run_reshape_and_cache
from vllm_metal.ops.reference import reshape_and_cache_ref


def inputs(dtype, num_tokens=7, num_blocks=5, block_size=8, heads=2, head_size=64, seed=0):
    rng = np.random.default_rng(seed)
    key = mx.array(rng.standard_normal((num_tokens, heads, head_size), dtype=np.float32)).astype(dtype)
    value = mx.array(rng.standard_normal((num_tokens, heads, head_size), dtype=np.float32)).astype(dtype)
    shape = (num_blocks, block_size, heads, head_size)
    key_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    value_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    return key, value, key_cache, value_cache


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32], ids=str)
def test_rows_land_in_their_slots_and_padding_is_skipped(kernels, ext, dtype):
    key, value, key_cache, value_cache = inputs(dtype)
    slots = mx.array([3, 17, -1, 0, 39, -1, 8], dtype=mx.int32)  # -1: padding
    ref_k, ref_v = reshape_and_cache_ref(key, value, key_cache, value_cache, slots)
    kc, vc = raw(key_cache), raw(value_cache)
    run_reshape_and_cache(kernels, ext, raw(key), raw(value), kc, vc, np.array(slots), DTYPE_NAMES[dtype],
                          orders=("reverse", "shuffled"))
    np.testing.assert_array_equal(kc, raw(ref_k))  # bit-exact copy
    np.testing.assert_array_equal(vc, raw(ref_v))


def test_slots_past_the_cache_are_skipped_in_bounds(kernels, ext):
    # A kernel cannot raise: out-of-range slots write nothing (the CPU op reports them).
    key, value, key_cache, value_cache = inputs(mx.float32, num_tokens=3)
    kc, vc = raw(key_cache), raw(value_cache)
    before = kc.copy()
    run_reshape_and_cache(kernels, ext, raw(key), raw(value), kc, vc, np.array([40, 1000, 39]), "float32",
                          guard=True)
    np.testing.assert_array_equal(kc.reshape(40, -1)[:39], before.reshape(40, -1)[:39])
    np.testing.assert_array_equal(kc.reshape(40, -1)[39], raw(key)[2].reshape(-1))


def test_row_longer_than_a_threadgroup(kernels, ext):
    # 4 heads x 256 = 1024 elements per row with at most 256 threads: each thread loops.
    key, value, key_cache, value_cache = inputs(mx.float16, num_tokens=2, heads=4, head_size=256)
    slots = mx.array([5, 30], dtype=mx.int32)
    ref_k, ref_v = reshape_and_cache_ref(key, value, key_cache, value_cache, slots)
    kc, vc = raw(key_cache), raw(value_cache)
    run_reshape_and_cache(kernels, ext, raw(key), raw(value), kc, vc, np.array(slots), "float16")
    np.testing.assert_array_equal(kc, raw(ref_k))
    np.testing.assert_array_equal(vc, raw(ref_v))
