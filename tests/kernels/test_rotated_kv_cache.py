"""KV caches of 4-bit rows in kernels_v2 on the MSL harness: rot4 (kv_quant 4,
rotated 4-bit keys and 4-bit values) and k8v4 (5: e4m3 keys, the same values;
csrc/kv_quant.h). reshape_and_cache_quant writes the codes of the float64 numpy
codecs (tests/ops/rotated_kv_np.py, kv_quant_np.py) up to float32's near-ties, and
the varlen, split-KV and GQA decode kernels (rot4: rotating the query in a
simdgroup) match numpy float64 attention over the keys and values the codecs decode.
The caches they read are written by the CPU op (tests/ops/test_rotated_kv_cache.py
holds it to the codecs exactly), with make_batch's NaN poison in every row a correct
kernel must not read."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import DTYPE_NAMES, raw, run_reshape_and_cache
from tests.ops import rotated_kv_cache_np as rot
from tests.ops import rotated_kv_np as codec
from tests.ops.kv_quant_np import quantize, read_cache
from tests.ops.paged_inputs import as_numpy, make_batch
from tests.kernels.test_kv_quant import run
from tests.ops.test_rotated_kv_cache import FMTS
from vllm_metal.attention.kv_quant import FORMATS

DTYPES = [mx.float16, mx.bfloat16, mx.float32]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_write_kernel_matches_the_numpy_codec(kernels, ext, d, dtype, fmt):
    rng = np.random.default_rng(d)
    t, heads = 9, 2
    x = rng.standard_normal((t, heads, d)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (t, heads, 1))).astype(np.float32)
    x[2, 1] = 0.0
    key = mx.array(x).astype(dtype)
    value = mx.array(x[::-1].copy()).astype(dtype)
    slots = np.array([3, 17, -1, 0, 39, -1, 8, 22, 30], dtype=np.int32)
    quant = FORMATS[fmt]
    kc = np.zeros((5, 8, heads, quant.key_width(d)), dtype=np.uint8)
    vc = np.zeros((5, 8, heads, quant.value_width(d)), dtype=np.uint8)
    run_reshape_and_cache(kernels, ext, raw(key), raw(value), kc, vc, slots, DTYPE_NAMES[dtype],
                          kv_quant=quant.code, orders=("reverse", "shuffled"))
    kc, vc = kc.reshape(40, heads, -1), vc.reshape(40, heads, -1)
    live = slots >= 0
    untouched = np.setdiff1d(np.arange(40), slots[live])
    assert not kc[untouched].any() and not vc[untouched].any()
    k_in = as_numpy(key).astype(np.float64)[live]
    v_in = as_numpy(value).astype(np.float64)[live]
    check_values(vc[slots[live]], v_in, d)
    if fmt == "k8v4":  # e4m3 keys: the codec's codes and scales exactly
        got_values, got_scales = read_cache(kc[slots[live]], d, "fp8_e4m3")
        want_values, want_scales = quantize(as_numpy(key)[live].astype(np.float32), "fp8_e4m3")
        np.testing.assert_array_equal(got_scales, want_scales)
        np.testing.assert_array_equal(got_values, want_values)
        return
    index, factor = rot.key_rows(kc[slots[live]], d)
    want = codec.encode_keys(k_in, 4)
    # float32 rotation: a coordinate within float32's error of an edge may take
    # the neighbouring level; nothing else differs.
    differ = index != want.index
    assert differ.mean() < 1e-3 and (np.abs(index.astype(int) - want.index)[differ] == 1).all()
    clean = ~differ.any(axis=-1)
    np.testing.assert_allclose((factor * np.sqrt(d))[clean], codec.key_factor(want, 4, True)[clean],
                               rtol=1e-5)
    np.testing.assert_allclose(rot.decoded_keys(kc[slots[live]], d)[clean],
                               codec.decode_keys(want, 4, True)[clean],
                               rtol=0, atol=1e-5 * np.abs(k_in).max())


def check_values(vc: np.ndarray, v_in: np.ndarray, d: int) -> None:
    """Value rows written in float32: the codec's up to near-ties."""
    got_v = rot.value_rows(vc, d)
    want_v = codec.encode_values(v_in, 4)
    np.testing.assert_allclose(got_v.step.astype(np.float64), want_v.step.astype(np.float64),
                               rtol=1e-3)
    np.testing.assert_array_equal(got_v.minimum, want_v.minimum)
    assert (got_v.code != want_v.code).mean() < 1e-3
    np.testing.assert_allclose(rot.decoded_values(vc, d), codec.decode_values(want_v),
                               rtol=0, atol=np.abs(v_in).max() * 0.07)


# (route, head size, the batch's decode rows only, the second call's partition).
ROUTES = [("Varlen", 64, False, None), ("Varlen", 128, False, None),
          ("Varlen", 256, False, None), ("SplitKv", 128, False, 64),
          ("GqaDecode", 128, True, 256), ("GqaDecode", 256, True, None)]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("route,head_size,decode,partition", ROUTES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_routes(kernels, ext, fmt, route, head_size, decode, partition, dtype):
    lens, rows = ([1, 7, 130, 515], [1, 1, 1, 1]) if decode else ([37, 300, 60, 21], [37, 1, 9, 3])
    batch = make_batch(lens, rows, num_heads=16 if decode else 4, num_kv_heads=2,
                       head_size=head_size, block_size=16, dtype=mx.float32, query_dtype=dtype,
                       seed=head_size)
    plan = run(kernels, ext, batch, fmt, route, dtype)
    assert plan["launches"][0]["constants"][4] == FORMATS[fmt].code
    if decode:
        assert plan["launches"][0]["kernel"].startswith("paged_attention_gqa_decode_")
    if partition:
        run(kernels, ext, batch, fmt, route, dtype, partition_size=partition)
