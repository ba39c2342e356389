"""expert_matmul (mixture-of-experts products) against a numpy float64 oracle,
the pure-MLX reference and MLX's own gather_qmm / gather_mm."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import (FLOATS, OUTPUT_EPS, as_f64, cpu_isa, make_quantized,
                                     promoted, random_float)
from vllm_metal.ops.experts import expert_matmul
from vllm_metal.ops.reference import expert_matmul_ref

E, N, K = 6, 45, 256


FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def mxfp4_dequantized(w: mx.array, scales: mx.array) -> np.ndarray:
    """float64 [..., N, K] of MXFP4 codes (8 per uint32, lowest bits first) and E8M0
    scales (2^(e - 127) per 32 columns), decoded here rather than by mx.dequantize."""
    words = np.array(w, dtype=np.uint64)
    codes = (words[..., None] >> (np.arange(8, dtype=np.uint64) * 4)) & np.uint64(15)
    values = FP4_VALUES[codes.reshape(*words.shape[:-1], -1).astype(np.int64)]
    exponents = np.array(scales).astype(np.float64) - 127.0
    return values * np.repeat(np.exp2(exponents), 32, axis=-1)


class Experts:
    """E experts [N, K]: float (bits 0), MLX affine-quantized, or MXFP4 (mode), with
    float64 copies."""

    def __init__(self, bits: int, group_size: int = 64, dtype=mx.float32, seed: int = 0,
                 n: int = N, k: int = K, experts: int = E, mode: str = "affine"):
        self.bits, self.group_size, self.mode = bits, group_size, mode
        if mode == "mxfp4":
            self.bits, self.group_size = 4, 32
            dense = random_float((experts, n, k), seed=seed)
            self.w, self.scales = mx.quantize(dense, group_size=32, bits=4, mode="mxfp4")
            self.biases = None
            self.w64 = mxfp4_dequantized(self.w, self.scales)
            self.dtype = dtype   # the output follows x's dtype
        elif bits:
            qs = [make_quantized(n, k, bits, group_size, scale_dtype=dtype, seed=seed + e)
                  for e in range(experts)]
            self.w = mx.stack([q.w for q in qs])
            self.scales = mx.stack([q.scales for q in qs])
            self.biases = mx.stack([q.biases for q in qs])
            self.w64 = np.stack([q.dequantized() for q in qs])
            self.dtype = dtype
        else:
            self.w = random_float((experts, n, k), dtype=dtype, seed=seed, scale=k ** -0.5)
            self.scales = self.biases = None
            self.w64 = as_f64(self.w)
            self.dtype = dtype

    def __call__(self, x, idx, bias=None):
        return expert_matmul(x, idx, self.w, self.scales, self.biases, bits=self.bits,
                             group_size=self.group_size, bias=bias, mode=self.mode)

    def reference(self, x, idx, bias=None):
        return expert_matmul_ref(x, idx, self.w, self.scales, self.biases, bits=self.bits,
                                 group_size=self.group_size, bias=bias, mode=self.mode)


def routing(tokens: int, top_k: int, experts: int = E, seed: int = 0) -> mx.array:
    """int32 [tokens * top_k]: distinct experts per token, as top-k routing picks them."""
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    return mx.array(picks.reshape(-1).astype(np.int32))


def assert_experts_close(out, x, idx, ex: Experts, bias=None) -> None:
    """out ~ the float64 oracle, within the output dtype's rounding of each entry's scale."""
    pairs = idx.shape[0]
    per_row = pairs // x.shape[0]
    x64 = np.repeat(as_f64(x), per_row, axis=0)
    w64 = ex.w64[np.array(idx)]                                   # [P, N, K]
    expected = np.einsum("pk,pnk->pn", x64, w64)
    magnitude = np.einsum("pk,pnk->pn", np.abs(x64), np.abs(w64))
    if bias is not None:
        b64 = as_f64(bias)[np.array(idx)]
        expected, magnitude = expected + b64, magnitude + np.abs(b64)
    weights = x.dtype if ex.mode == "mxfp4" else ex.dtype
    out_dtype = promoted(x.dtype, weights, *(() if bias is None else (bias.dtype,)))
    assert out.dtype == out_dtype and out.shape == (pairs, ex.w64.shape[1])
    got = as_f64(out)
    assert np.isfinite(got).all()
    tol = OUTPUT_EPS[out_dtype] * (magnitude + np.abs(expected)) + 1e-30
    bad = np.abs(got - expected) > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst {np.abs(got - expected).max():.3g}"


@pytest.mark.parametrize("bits,group_size", [(0, 0), (4, 32), (4, 64), (4, 128), (8, 32), (8, 64)])
@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("shared", [True, False], ids=["token_rows", "pair_rows"])
def test_matches_the_float64_oracle(bits, group_size, tokens, shared):
    # 40 tokens at top-2 of 6 experts: experts get ~13 pairs, past the GEMV's 12
    # rows, so both the GEMV and the panel GEMM paths run (and mix in one call).
    ex = Experts(bits, group_size, seed=tokens)
    idx = routing(tokens, 2, seed=tokens)
    x = random_float((tokens if shared else 2 * tokens, K), seed=tokens + 1)
    out = ex(x, idx)
    assert_experts_close(out, x, idx, ex)
    np.testing.assert_allclose(np.array(out), np.array(ex.reference(x, idx)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tokens", [1, 3, 40])
@pytest.mark.parametrize("x_dtype", FLOATS, ids=str)
def test_mxfp4_experts(tokens, x_dtype):
    """gpt-oss's experts as mlx-community ships them: FP4 codes, E8M0 scales."""
    ex = Experts(4, mode="mxfp4", seed=tokens)
    idx = routing(tokens, 2, seed=tokens)
    x = random_float((tokens, K), dtype=x_dtype, seed=tokens + 2)
    out = ex(x, idx)
    assert_experts_close(out, x, idx, ex)
    if x_dtype == mx.float32:   # MLX's own half-precision kernel rounds as it goes
        want = mx.gather_qmm(x.reshape(tokens, 1, 1, K), ex.w, ex.scales, None,
                             rhs_indices=idx.reshape(tokens, 2), transpose=True, group_size=32,
                             bits=4, mode="mxfp4")
        np.testing.assert_allclose(as_f64(out), as_f64(want).reshape(2 * tokens, N),
                                   rtol=1e-4, atol=1e-4)


def test_mxfp4_extreme_scales():
    """E8M0 exponents 0 (2^-127, a denormal), 1 and 254 decode as MLX decodes them."""
    ex = Experts(4, mode="mxfp4", seed=5)
    scales = np.array(ex.scales)
    scales[0, :, 0] = 0
    scales[1, :, 1] = 1
    scales[2, :, 2] = 254
    ex.scales = mx.array(scales)
    ex.w64 = mxfp4_dequantized(ex.w, ex.scales)
    idx = mx.array([0, 1, 2, 3], dtype=mx.int32)
    x = random_float((4, K), seed=6, scale=1e-36)   # keeps the 2^127 group finite
    assert_experts_close(ex(x, idx), x, idx, ex)


@pytest.mark.parametrize("bits", [0, 4, 8])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("x_dtype", FLOATS, ids=str)
def test_activation_and_weight_dtypes(bits, dtype, x_dtype):
    ex = Experts(bits, 32, dtype=dtype, seed=2)
    idx = routing(5, 3, seed=2)
    x = random_float((5, K), dtype=x_dtype, seed=3)
    assert_experts_close(ex(x, idx), x, idx, ex)


@pytest.mark.parametrize("bits", [0, 4])
@pytest.mark.parametrize("tokens", [1, 30])
def test_expert_bias(bits, tokens):
    ex = Experts(bits, 64, seed=4)
    bias = random_float((E, N), seed=5)
    idx = routing(tokens, 2, seed=6)
    x = random_float((tokens, K), seed=7)
    assert_experts_close(ex(x, idx, bias), x, idx, ex, bias)


@pytest.mark.parametrize("bits", [0, 4, 8])
def test_agrees_with_mlx_gather_ops(bits):
    """What mlx-lm's SwitchLinear computes: gather_qmm / gather_mm over [T, 1, 1, K] rows."""
    ex = Experts(bits, 64, seed=8)
    tokens, top_k = 7, 2
    idx = routing(tokens, top_k, seed=9)
    x = random_float((tokens, K), seed=10)
    x4 = x.reshape(tokens, 1, 1, K)
    ids = idx.reshape(tokens, top_k)
    if bits:
        want = mx.gather_qmm(x4, ex.w, ex.scales, ex.biases, rhs_indices=ids, transpose=True,
                             group_size=64, bits=bits)
    else:
        want = mx.gather_mm(x4, ex.w.swapaxes(-1, -2), rhs_indices=ids)
    np.testing.assert_allclose(np.array(ex(x, idx)), np.array(want).reshape(tokens * top_k, N),
                               rtol=1e-4, atol=1e-4)


def test_untouched_experts_do_not_reach_the_output():
    """Experts no pair names hold NaN: nothing of them may show up."""
    ex = Experts(4, 64, seed=11)
    poisoned = np.array(ex.scales)
    poisoned[[0, 2, 5]] = np.nan
    ex.scales = mx.array(poisoned)
    idx = mx.array([1, 3, 4, 1, 3, 3], dtype=mx.int32)
    x = random_float((3, K), seed=12)
    out = np.array(ex(x, idx))
    assert np.isfinite(out).all()
    ex.w64[[0, 2, 5]] = 0.0
    assert_experts_close(mx.array(out), x, idx, ex)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("bits,mode", [(0, "affine"), (4, "affine"), (8, "affine"), (4, "mxfp4")])
def test_every_instruction_set(isa, bits, mode):
    ex = Experts(bits, 32, seed=13, mode=mode)
    idx = routing(20, 2, seed=14)
    x = random_float((20, K), seed=15)
    with cpu_isa(isa):
        out = ex(x, idx)
        mx.eval(out)
    assert_experts_close(out, x, idx, ex)


def test_a_pair_alone_matches_it_in_a_batch():
    """The same row and expert give the same product alone or among other tokens
    (to fp32 summation-order noise: a GEMV of 1 or 4 rows, or the GEMM)."""
    ex = Experts(4, 64, seed=16)
    x = random_float((30, K), seed=17)
    idx = routing(30, 2, seed=18)
    batch = np.array(ex(x, idx))
    alone = np.array(ex(x[:1], idx[:2]))
    np.testing.assert_allclose(batch[:2], alone, rtol=1e-5, atol=1e-5)


def test_uint32_and_int64_indices():
    ex = Experts(8, 64, seed=19)
    x = random_float((4, K), seed=20)
    idx = routing(4, 2, seed=21)
    want = np.array(ex(x, idx))
    for dtype in (mx.uint32, mx.int64, mx.uint8):
        np.testing.assert_array_equal(np.array(ex(x, idx.astype(dtype))), want)


@pytest.mark.parametrize("bad", [-1, E, 2**31])
def test_an_index_outside_the_experts_raises_at_evaluation(bad):
    ex = Experts(4, 64, seed=22)
    x = random_float((2, K), seed=23)
    idx = mx.array([0, 1, 2, bad], dtype=mx.int64 if bad >= 2**31 else mx.int32)
    if bad >= 2**31:
        idx = idx.astype(mx.uint32)
    out = ex(x, idx)
    with pytest.raises((IndexError, ValueError, RuntimeError), match="expert index"):
        mx.eval(out)


def test_no_pairs_and_empty_k():
    ex = Experts(0, 0, seed=24)
    out = ex(mx.zeros((0, K)), mx.zeros((0,), dtype=mx.int32))
    assert out.shape == (0, N)
    w = mx.zeros((3, 5, 0))
    bias = random_float((3, 5), seed=25)
    got = expert_matmul(mx.zeros((2, 0)), mx.array([2, 0], dtype=mx.int32), w, bias=bias)
    np.testing.assert_array_equal(np.array(got), np.array(bias)[[2, 0]])


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=mx.zeros((3, K)), idx=mx.zeros((4,), dtype=mx.int32)), "must divide"),
    (dict(x=mx.zeros((2, 1, K))), "x must be float"),
    (dict(idx=mx.zeros((2, 2), dtype=mx.int32)), "idx must be"),
    (dict(idx=mx.zeros((2,), dtype=mx.float32)), "idx must be an integer"),
    (dict(bits=3), "bits must be"),
    (dict(group_size=48), "group_size"),
    (dict(scales=None), "scales and biases"),
    (dict(bias=mx.zeros((E,))), "bias must be"),
    (dict(x=mx.zeros((2, K - 32))), "quantized w"),
    (dict(mode="nvfp4"), "mode must be"),
    (dict(mode="mxfp4"), "mxfp4"),
])
def test_bad_arguments_are_named(kwargs, match):
    ex = Experts(4, 64, seed=26)
    args = dict(x=mx.zeros((2, K)), idx=mx.zeros((2,), dtype=mx.int32), w=ex.w,
                scales=ex.scales, biases=ex.biases, bits=4, group_size=64, bias=None,
                mode="affine")
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        expert_matmul(args.pop("x"), args.pop("idx"), args.pop("w"), args.pop("scales"),
                      args.pop("biases"), **args)
