"""Quantized KV caches (``--kv-cache-dtype fp8 / fp8_e5m2 / int8_per_token_head``):
the codes and scales reshape_and_cache writes against the independent numpy codec
(kv_quant_np), and paged attention over such caches against numpy float64
attention over the decoded values, on every ISA, head-size kernel and route. The
helpers here also write and decode the formats of 4-bit rows (rot4, k8v4), whose
own tests are in test_rotated_kv_cache.py.

make_batch poisons every cache row a correct kernel must not read with NaN; a
quantized row holding a NaN gets a NaN scale, so an over-read still shows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops import rotated_kv_cache_np as rot
from tests.ops.attention_np import paged_attention_np
from tests.ops.isa import cpu_isa
from tests.ops.kv_quant_np import code_values, quantize, read_cache
from tests.ops.paged_inputs import as_numpy, forced, make_batch
from vllm_metal import ops
from vllm_metal.attention import kv_quant

FORMATS = ["int8", "fp8_e4m3", "fp8_e5m2"]
PACKED = ["rot4", "k8v4"]  # 4-bit rows


def write(keys: np.ndarray, values: np.ndarray, fmt: str, slots=None):
    """float32 [T, H, D] rows -> the op's uint8 caches [T, 1, H, width] (slot i = row i)."""
    t, h, d = keys.shape
    quant = kv_quant.FORMATS[fmt]
    kc = mx.zeros((t, 1, h, quant.key_width(d)), dtype=mx.uint8)
    vc = mx.zeros((t, 1, h, quant.value_width(d)), dtype=mx.uint8)
    slots = mx.arange(t, dtype=mx.int32) if slots is None else slots
    kc, vc = ops.reshape_and_cache(mx.array(keys), mx.array(values), kc, vc, slots, kv_quant=fmt)
    mx.eval(kc, vc)
    return np.array(kc), np.array(vc)


def decoded(cache: np.ndarray, d: int, fmt: str, keys: bool = True) -> np.ndarray:
    """float64 [..., d]: what a cache of rows in ``fmt`` reads back."""
    if fmt in PACKED:
        return rot.decoded_keys(cache, d, fmt) if keys else rot.decoded_values(cache, d)
    values, scales = read_cache(cache, d, fmt)
    return values * scales[..., None].astype(np.float64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_codes_and_scales_match_the_numpy_codec(fmt):
    rng = np.random.default_rng(1)
    # Rows of very different magnitudes (per-row scales), a zero row, values
    # in the formats' subnormal range, and rows of exact ties.
    x = rng.standard_normal((40, 2, 64)).astype(np.float32)
    x *= np.exp(rng.uniform(-8, 8, (40, 2, 1))).astype(np.float32)
    x[3, 1] = 0.0
    x[4, 0] = rng.standard_normal(64).astype(np.float32) * 1e-3
    x[4, 0, 0] = 1.0  # the rest sits near the smallest codes
    largest = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[fmt]
    values = code_values(fmt)
    finite = np.sort(np.unique(np.abs(values[np.isfinite(values)])))
    midpoints = (finite[:-1] + finite[1:]) / 2  # halfway between neighbouring codes
    tie_row = np.resize(midpoints[midpoints < largest], 64).astype(np.float32)
    tie_row[0] = largest  # scale exactly 1
    x[5, 0] = tie_row
    x[5, 1] = -tie_row
    kc, vc = write(x, -x, fmt)
    for cache, rows in ((kc, x), (vc, -x)):
        got_values, got_scales = read_cache(cache[:, 0], 64, fmt)
        want_values, want_scales = quantize(rows, fmt)
        np.testing.assert_array_equal(got_scales, want_scales)
        np.testing.assert_array_equal(got_values, want_values)
    assert (np.abs(read_cache(kc[:, 0], 64, fmt)[0]) <= largest).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_error_stays_within_half_a_code_step(fmt):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 4, 128)).astype(np.float32)
    kc, _ = write(x, x, fmt)
    back = decoded(kc[:, 0], 128, fmt)
    amax = np.abs(x).max(-1, keepdims=True)
    # Relative step of the format near the top of its range: int8 1/127,
    # e4m3 2^-3, e5m2 2^-2 (of the value); half a step is the rounding bound.
    if fmt == "int8":
        assert (np.abs(back - x) <= amax / 127 / 2 * 1.0001).all()
    else:
        rel = {"fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}[fmt]
        floor = amax / {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}[fmt] * 2.0**-6
        assert (np.abs(back - x) <= np.abs(x) * rel + floor).all()


def test_nan_rows_read_back_as_nan_and_padding_slots_are_skipped():
    x = np.ones((3, 1, 64), dtype=np.float32)
    x[1, 0, 5] = np.nan
    kc, _ = write(x, x, "fp8_e4m3", slots=mx.array([0, 1, -1], dtype=mx.int32))
    assert np.isnan(read_cache(kc[:, 0], 64, "fp8_e4m3")[1][1])
    assert not kc[2].any()  # slot -1: nothing written


def quantized_batch(batch, fmt):
    """The batch's float32 caches written through the op: (key, value) uint8 caches."""
    nb, bs, h, d = batch.key_cache.shape
    rows = nb * bs
    keys = np.array(batch.key_cache).reshape(rows, h, d)
    values = np.array(batch.value_cache).reshape(rows, h, d)
    kc, vc = write(keys, values, fmt)
    return mx.array(kc.reshape(nb, bs, h, -1)), mx.array(vc.reshape(nb, bs, h, -1))


def check(batch, fmt, **options):
    kc, vc = quantized_batch(batch, fmt)
    d = batch.query.shape[2]
    out = ops.paged_attention(batch.query, kc, vc, batch.block_tables, batch.seq_lens,
                              batch.cu_seqlens_q, batch.scale, kv_quant=fmt, **options)
    sinks = options.pop("sinks", None)
    expected = paged_attention_np(
        as_numpy(batch.query), decoded(np.array(kc), d, fmt),
        decoded(np.array(vc), d, fmt, keys=False), np.array(batch.block_tables),
        np.array(batch.seq_lens), np.array(batch.cu_seqlens_q), batch.scale,
        sinks=None if sinks is None else as_numpy(sinks), **options)
    actual = as_numpy(out)
    assert np.isfinite(actual).all(), "output has NaN: the kernel read poisoned rows"
    np.testing.assert_allclose(actual, expected, rtol=0, atol=3e-5)
    return out


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_size", [64, 128, 80])
def test_attention_over_quantized_caches(isa, fmt, head_size):
    # Decode rows and prefill chunks in one batch; 80 takes the tile kernel.
    batch = make_batch([1, 16, 100, 70], [1, 16, 1, 9], num_heads=6, num_kv_heads=2,
                       head_size=head_size, seed=head_size)
    with cpu_isa(isa):
        check(batch, fmt)
        with forced("SplitKv", 37):
            check(batch, fmt)


@pytest.mark.parametrize("fmt", FORMATS + PACKED)
def test_decode_routes_and_options(fmt):
    batch = make_batch([5, 120, 333], [1, 1, 1], num_heads=8, num_kv_heads=2, seed=3)
    with forced("GqaDecode", 37):
        check(batch, fmt)
    check(batch, fmt, sliding_window=50)
    check(batch, fmt, softcap=5.0)
    check(batch, fmt, sinks=mx.array(np.linspace(-1, 1, 8).astype(np.float32)))


def test_bfloat16_queries_read_quantized_caches():
    batch = make_batch([40, 7], [3, 1], query_dtype=mx.bfloat16, seed=4)
    kc, vc = quantized_batch(batch, "int8")
    got = ops.paged_attention(batch.query, kc, vc, batch.block_tables, batch.seq_lens,
                              batch.cu_seqlens_q, batch.scale, kv_quant="int8")
    assert got.dtype == mx.bfloat16
    expected = paged_attention_np(
        as_numpy(batch.query), decoded(np.array(kc), 64, "int8"), decoded(np.array(vc), 64, "int8"),
        np.array(batch.block_tables), np.array(batch.seq_lens), np.array(batch.cu_seqlens_q),
        batch.scale)
    np.testing.assert_allclose(as_numpy(got), expected, rtol=0, atol=2e-2)


def test_quantized_caches_are_validated():
    batch = make_batch([8], [1])
    kc, vc = quantized_batch(batch, "int8")
    args = (batch.query, kc, vc, batch.block_tables, batch.seq_lens, batch.cu_seqlens_q, 0.1)
    with pytest.raises(ValueError, match="kv_quant must be one of"):
        ops.paged_attention(*args, kv_quant="fp4")
    with pytest.raises(TypeError, match="must be float16, bfloat16 or float32"):
        ops.paged_attention(*args)  # a uint8 cache without its format
    with pytest.raises(TypeError, match="must be uint8"):
        ops.paged_attention(batch.query, batch.key_cache, batch.value_cache,
                            *args[3:], kv_quant="int8")
    narrow = kc[..., :64]
    with pytest.raises(ValueError, match="rows of 68"):
        ops.paged_attention(batch.query, narrow, narrow, *args[3:], kv_quant="int8")
    with pytest.raises(ValueError, match="head_size \\+ 4"):
        ops.reshape_and_cache(mx.zeros((1, 2, 64)), mx.zeros((1, 2, 64)), narrow, narrow,
                              mx.array([0]), kv_quant="int8")
