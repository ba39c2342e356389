"""Quantized KV caches in kernels_v2 on the MSL harness: reshape_and_cache_quant
writes the codes and scales of the independent numpy codec (tests/ops/kv_quant_np),
and the varlen, split-KV and GQA decode kernels with the kv_quant function constant
match numpy float64 attention over the decoded caches, for every query dtype.
The caches they read are written by the CPU op (tests/ops/test_kv_quant.py holds
it to the same codec), with make_batch's NaN poison in every row a correct kernel
must not read."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import DTYPE_NAMES, raw, run_paged_attention, run_reshape_and_cache
from tests.ops.attention_np import paged_attention_np
from tests.ops.kv_quant_np import quantize, read_cache
from tests.ops.paged_inputs import TOLERANCE, as_numpy, make_batch
from tests.ops.test_kv_quant import PACKED, decoded, quantized_batch
from vllm_metal.attention.kv_quant import FORMATS

DTYPES = [mx.float16, mx.bfloat16, mx.float32]
# One code a byte with a row scale (4-bit rows: test_rotated_kv_cache.py).
BYTE_FORMATS = [name for name, fmt in FORMATS.items() if not fmt.packed]


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_write_kernel_matches_the_numpy_codec(kernels, ext, fmt, dtype):
    rng = np.random.default_rng(7)
    t, heads, d = 9, 2, 128
    x = rng.standard_normal((t, heads, d)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (t, heads, 1))).astype(np.float32)
    x[2, 1] = 0.0
    key = mx.array(x).astype(dtype)
    value = -key
    slots = np.array([3, 17, -1, 0, 39, -1, 8, 22, 30], dtype=np.int32)
    cache = np.zeros((5, 8, heads, d + 4), dtype=np.uint8)
    kc, vc = cache.copy(), cache.copy()
    run_reshape_and_cache(kernels, ext, raw(key), raw(value), kc, vc, slots, DTYPE_NAMES[dtype],
                          kv_quant=FORMATS[fmt].code, orders=("reverse", "shuffled"))
    for cache_out, rows in ((kc, key), (vc, value)):
        flat = cache_out.reshape(40, heads, d + 4)
        got_values, got_scales = read_cache(flat, d, fmt)
        want_values, want_scales = quantize(as_numpy(rows).astype(np.float32), fmt)
        for i, slot in enumerate(slots):
            if slot < 0:
                continue
            np.testing.assert_array_equal(got_scales[slot], want_scales[i])
            np.testing.assert_array_equal(got_values[slot], want_values[i])
        untouched = np.setdiff1d(np.arange(40), slots[slots >= 0])
        assert not flat[untouched].any()


def run(kernels, ext, batch, fmt, route, dtype, partition_size=512, **options):
    kc, vc = quantized_batch(batch, fmt)
    quantized = type(batch)(query=batch.query, key_cache=kc, value_cache=vc,
                            block_tables=batch.block_tables, seq_lens=batch.seq_lens,
                            cu_seqlens_q=batch.cu_seqlens_q, scale=batch.scale)
    out, plan = run_paged_attention(kernels, ext, quantized, route,
                                    partition_size=partition_size, kv_quant=FORMATS[fmt].code,
                                    orders=("forward", "shuffled"), **options)
    sinks = options.get("sinks")
    d = batch.query.shape[2]
    expected = paged_attention_np(
        as_numpy(batch.query), decoded(np.array(kc), d, fmt),
        decoded(np.array(vc), d, fmt, keys=False),
        np.array(batch.block_tables), np.array(batch.seq_lens), np.array(batch.cu_seqlens_q),
        batch.scale, sliding_window=options.get("sliding_window"), softcap=options.get("softcap"),
        sinks=None if sinks is None else as_numpy(sinks))
    assert np.isfinite(out).all(), "NaN in the output: a poisoned row was read"
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOLERANCE[dtype])
    return plan


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_and_split_kv(kernels, ext, fmt, dtype):
    batch = make_batch([37, 300, 60, 21], [37, 1, 9, 3], num_heads=4, num_kv_heads=2, head_size=80,
                       block_size=16, dtype=mx.float32, query_dtype=dtype, seed=5)
    plan = run(kernels, ext, batch, fmt, "Varlen", dtype)
    assert plan["launches"][0]["constants"][4] == FORMATS[fmt].code
    run(kernels, ext, batch, fmt, "SplitKv", dtype, partition_size=64)


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gqa_decode(kernels, ext, fmt, dtype):
    batch = make_batch([1, 7, 130, 515], [1, 1, 1, 1], num_heads=16, num_kv_heads=2, head_size=128,
                       block_size=16, dtype=mx.float32, query_dtype=dtype, seed=6)
    plan = run(kernels, ext, batch, fmt, "GqaDecode", dtype)
    assert plan["launches"][0]["kernel"].startswith("paged_attention_gqa_decode_")
    run(kernels, ext, batch, fmt, "GqaDecode", dtype, partition_size=256)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", *PACKED])
def test_options(kernels, ext, fmt):
    batch = make_batch([100, 40], [30, 1], num_heads=4, num_kv_heads=2, head_size=64, block_size=8,
                       seed=8)
    run(kernels, ext, batch, fmt, "Varlen", mx.float32, sliding_window=7)
    run(kernels, ext, batch, fmt, "Varlen", mx.float32, softcap=5.0)
    run(kernels, ext, batch, fmt, "Varlen", mx.float32, sinks=mx.array([-2.0, 0.0, 1.5, 4.0]))
