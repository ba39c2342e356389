"""KV caches of 4-bit rows: ``--kv-cache-dtype turboquant_4bit_nc`` (the native
``kv_quant="rot4"``: rotated 4-bit keys and 4-bit values) and ``turboquant_k8v4``
(``"k8v4"``: e4m3 keys, the same 4-bit values). The codes reshape_and_cache writes
against the float64 numpy codecs (tests/ops/rotated_kv_np.py, kv_quant_np.py), and
paged attention over such caches against numpy float64 attention over the keys and
values the codecs decode, on every ISA, head size, route and option; a row's output
is the same bits in any call.

make_batch poisons every cache row a correct kernel must not read with NaN; written
through the op a NaN row gets a NaN factor (keys) or step (values), so an over-read
still shows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops import rotated_kv_cache_np as rot
from tests.ops import rotated_kv_np as codec
from tests.ops.attention_np import paged_attention_np
from tests.ops import test_kv_quant as kv_quant_ops
from tests.ops.kv_quant_np import quantize, read_cache
from tests.ops.test_kv_quant import PACKED, check
from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import PagedBatch, as_numpy, forced, make_batch
from tests.ops.test_attention_invariance import call
from vllm_metal import ops
from vllm_metal.ops.reference import kv_rows_ref, paged_attention_ref
from vllm_metal.attention.rotated_kv import hadamard, lloyd_max_levels


FMTS = PACKED


def write(keys: np.ndarray, values: np.ndarray, fmt: str = "rot4", slots=None):
    """float32 [T, H, D] rows -> the op's uint8 caches [T, H, width] (slot i = row i)."""
    kc, vc = kv_quant_ops.write(keys, values, fmt, slots)
    return kc[:, 0], vc[:, 0]


@pytest.mark.parametrize("d", [64, 128, 256])
def test_codes_match_the_numpy_codec(d):
    rng = np.random.default_rng(d)
    # Rows of very different magnitudes, a zero row, a constant row (step 0),
    # a row with one outlier, and rows whose values sit on float16 steps.
    x = rng.standard_normal((48, 2, d)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (48, 2, 1))).astype(np.float32)
    x[3, 1] = 0.0
    x[4, 0] = 0.25
    x[5, 1, 7] = 300.0
    x[6, 0] = np.arange(d, dtype=np.float32) % 16 * 0.5 - 3.0
    v = x[::-1].copy()
    kc, vc = write(x, v)
    check_values(vc, v, d)
    index, factor = rot.key_rows(kc, d)
    want = codec.encode_keys(x, 4)
    # Exact codes, except where a rotated coordinate sits on the edge between two
    # levels (the structured rows' exact zeros): there float64 rounding picks a
    # side, and either neighbour is right.
    rotated = x.astype(np.float64) @ hadamard(d)
    unit = rotated / np.maximum(np.linalg.norm(rotated, axis=-1, keepdims=True), 1e-300)
    levels = lloyd_max_levels(d, 4)
    edges = (levels[:-1] + levels[1:]) / 2
    tie = np.abs(unit[..., None] - edges).min(axis=-1) < 1e-12
    live = x.any(axis=-1)[..., None] & ~tie
    np.testing.assert_array_equal(index[live], want.index[live])
    assert (np.abs(index[tie].astype(int) - want.index[tie]) <= 1).all()
    # The cache's factor multiplies the levels of N(0, 1), the codec's those of
    # N(0, 1/d), sqrt(d) times smaller.
    np.testing.assert_allclose(factor * np.sqrt(d), codec.key_factor(want, 4, True), rtol=1e-7)
    clean = ~tie.any(axis=-1)
    np.testing.assert_allclose(rot.decoded_keys(kc, d)[clean],
                               codec.decode_keys(want, 4, True)[clean],
                               rtol=0, atol=1e-6 * np.abs(x).max())
    # A zero key reads back as zeros.
    assert not rot.decoded_keys(kc, d)[3, 1].any()


def check_values(vc: np.ndarray, v: np.ndarray, d: int) -> None:
    """The value rows hold the codec's codes, step and minimum, bit for bit."""
    got_v = rot.value_rows(vc, d)
    want_v = codec.encode_values(v, 4)
    np.testing.assert_array_equal(got_v.code, want_v.code)
    np.testing.assert_array_equal(got_v.step.view(np.uint16), want_v.step.view(np.uint16))
    np.testing.assert_array_equal(got_v.minimum.view(np.uint16), want_v.minimum.view(np.uint16))
    constant = (v == v[..., :1]).all(axis=-1)
    decoded = rot.decoded_values(vc, d)
    np.testing.assert_array_equal(decoded[constant], v[constant])  # constant rows exactly


@pytest.mark.parametrize("d", [64, 128, 256])
def test_k8v4_keys_are_e4m3_rows_and_values_4_bit(d):
    rng = np.random.default_rng(d + 1)
    x = rng.standard_normal((40, 2, d)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (40, 2, 1))).astype(np.float32)
    x[3, 1] = 0.0
    x[4, 0] = 0.25
    v = x[::-1].copy()
    kc, vc = write(x, v, "k8v4")
    assert kc.shape[-1] == d + 4 and vc.shape[-1] == d // 2 + 4
    got_values, got_scales = read_cache(kc, d, "fp8_e4m3")
    want_values, want_scales = quantize(x, "fp8_e4m3")
    np.testing.assert_array_equal(got_scales, want_scales)
    np.testing.assert_array_equal(got_values, want_values)
    check_values(vc, v, d)


@pytest.mark.parametrize("fmt", FMTS)
def test_nan_rows_read_back_as_nan_and_padding_is_skipped(fmt):
    x = np.ones((3, 1, 64), dtype=np.float32)
    x[1, 0, 5] = np.nan
    kc, vc = write(x, x, fmt, slots=mx.array([0, 1, -1], dtype=mx.int32))
    assert np.isnan(rot.decoded_keys(kc, 64, fmt)[1]).all()
    assert np.isnan(rot.decoded_values(vc, 64)[1]).all()
    assert not kc[2].any() and not vc[2].any()  # slot -1: nothing written


def quantized(batch: PagedBatch, fmt: str = "rot4") -> PagedBatch:
    """The batch with its float32 caches written through the op in format ``fmt``."""
    kc, vc = kv_quant_ops.quantized_batch(batch, fmt)
    return PagedBatch(batch.query, kc, vc, batch.block_tables, batch.seq_lens,
                      batch.cu_seqlens_q, batch.scale)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("fmt", FMTS)
def test_attention_over_4_bit_caches(isa, head_size, fmt):
    # Decode rows and prefill chunks in one batch, pages of 16 and of 8 keys.
    for block_size in (16, 8):
        batch = make_batch([1, 16, 100, 70], [1, 16, 1, 9], num_heads=6, num_kv_heads=2,
                           head_size=head_size, block_size=block_size, seed=head_size)
        with cpu_isa(isa):
            check(batch, fmt)
            with forced("SplitKv", 37):
                check(batch, fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_the_pure_mlx_reference_agrees(fmt):
    # vllm_metal.ops.reference decodes the rows in MLX: the same keys and values as
    # the numpy reading, and attention over them as the kernel's.
    batch = make_batch([90, 33], [4, 1], num_heads=4, num_kv_heads=2, head_size=128, seed=9)
    q = quantized(batch, fmt)
    kc = np.array(q.key_cache)
    np.testing.assert_allclose(np.array(kv_rows_ref(q.key_cache, 128, fmt, keys=True)),
                               rot.decoded_keys(kc, 128, fmt), rtol=0, atol=1e-5, equal_nan=True)
    values = rot.decoded_values(np.array(q.value_cache), 128).astype(np.float32)
    np.testing.assert_array_equal(np.array(kv_rows_ref(q.value_cache, 128, fmt, keys=False)),
                                  values)
    want = paged_attention_ref(*q.args(), kv_quant=fmt)
    np.testing.assert_allclose(as_numpy(ops.paged_attention(*q.args(), kv_quant=fmt)),
                               as_numpy(want), rtol=0, atol=3e-5)


@pytest.mark.parametrize("fmt", FMTS)
def test_half_precision_queries(fmt):
    batch = make_batch([40, 7], [3, 1], query_dtype=mx.bfloat16, seed=4)
    q = quantized(batch, fmt)
    got = ops.paged_attention(*q.args(), kv_quant=fmt)
    assert got.dtype == mx.bfloat16
    expected = paged_attention_np(
        as_numpy(batch.query), rot.decoded_keys(np.array(q.key_cache), 64, fmt),
        rot.decoded_values(np.array(q.value_cache), 64), np.array(batch.block_tables),
        np.array(batch.seq_lens), np.array(batch.cu_seqlens_q), batch.scale)
    np.testing.assert_allclose(as_numpy(got), expected, rtol=0, atol=2e-2)


@pytest.mark.parametrize("isa", ["avx512", "generic"])
@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_is_the_same_in_any_call(isa, fmt):
    batch = quantized(make_batch([700, 40, 1300], [5, 40, 1], num_heads=9, num_kv_heads=3,
                                 head_size=64, seed=3), fmt)
    options = {"kv_quant": fmt}
    everyone = [0, 1, 2]
    whole = [(0, 5), (0, 40), (0, 1)]
    with cpu_isa(isa):
        alone = {(s, r): call(batch, [s], [(r, r + 1)], options)
                 for s in everyone for r in range(whole[s][1])}
        for route, partition in [(None, 512), ("SplitKv", 64), ("SplitKv", 100)]:
            with forced(route, partition):
                got = call(batch, everyone[::-1], whole[::-1], options)
            at = 0
            for s in everyone[::-1]:
                for r in range(whole[s][1]):
                    assert np.array_equal(got[at], alone[(s, r)][0]), f"{route}: seq {s} row {r}"
                    at += 1


def test_rotated_caches_are_validated():
    batch = make_batch([8], [1], head_size=80)
    cache = mx.zeros((batch.key_cache.shape[0], 16, 2, 44), dtype=mx.uint8)
    with pytest.raises(ValueError, match="head sizes 64, 128 and 256, got 80"):
        ops.paged_attention(batch.query, cache, cache, *batch.args()[3:], kv_quant="rot4")
    with pytest.raises(ValueError, match="head sizes 64, 128 and 256, got 80"):
        ops.reshape_and_cache(mx.zeros((1, 2, 80)), mx.zeros((1, 2, 80)), cache, cache,
                              mx.array([0]), kv_quant="rot4")
    batch = make_batch([8], [1])
    wide = mx.zeros((batch.key_cache.shape[0], 16, 2, 68), dtype=mx.uint8)
    with pytest.raises(ValueError, match="rows of 36"):
        ops.paged_attention(batch.query, wide, wide, *batch.args()[3:], kv_quant="rot4")
    # k8v4: keys of 68 bytes, values of 36.
    with pytest.raises(ValueError, match="value_cache .*rows of 36"):
        ops.paged_attention(batch.query, wide, wide, *batch.args()[3:], kv_quant="k8v4")
    with pytest.raises(ValueError, match="value_cache shape"):
        ops.paged_attention(batch.query, wide, wide[:, :8], *batch.args()[3:], kv_quant="k8v4")
