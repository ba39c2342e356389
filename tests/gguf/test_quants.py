"""GGML blocks -> MLX affine triples, against the `gguf` package's own dequantizer."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest

from tests import gguf_kquants
from vllm_metal.gguf.quants import byte_size, to_mlx

EXACT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K")
ROWS, COLS = 6, 512


def random_blocks(kind: str, seed: int = 0) -> np.ndarray:
    """uint8 [ROWS, COLS / block * bytes]: random bytes with sane fp16 scales, so every
    bit pattern of the levels and packed scales is exercised."""
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (ROWS * COLS // block, size), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.05, (len(data), 2)).astype(np.float16).view(np.uint8)
    if kind == "Q6_K":  # d is the block's last two bytes
        data[:, -2:] = halves[:, :2]
    else:  # d (and m / dmin) lead the block
        data[:, :4] = halves
    return data.reshape(ROWS, -1)


def reference(raw: np.ndarray, kind: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(ROWS, COLS)


def ours(raw: np.ndarray, kind: str) -> tuple[np.ndarray, int]:
    qtype = gguf.GGMLQuantizationType[kind]
    tensor = to_mlx(raw.reshape(-1), int(qtype), (ROWS, COLS))
    a = tensor.arrays
    values = mx.dequantize(a["weight"], a["scales"], a["biases"], group_size=32,
                           bits=tensor.bits)
    return np.array(values), tensor.bits


@pytest.mark.parametrize("kind", EXACT)
def test_exact_types_decode_to_the_reference_values(kind):
    raw = random_blocks(kind)
    values, bits = ours(raw, kind)
    assert bits == (4 if kind in ("Q4_0", "Q4_1", "Q4_K") else 8)
    ref = reference(raw, kind)
    # Same float32 products (scale * level + offset) up to one rounding of each term.
    np.testing.assert_allclose(values, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_test_encoders_round_trip(kind):
    rng = np.random.default_rng(1)
    weights = rng.normal(size=(4, 512)).astype(np.float32)
    decoded = reference_of(gguf_kquants.quantize(weights, kind), kind, weights.shape)
    levels = {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind]
    step = (weights.max() - weights.min()) / levels
    assert np.abs(decoded - weights).max() <= step


def reference_of(raw: np.ndarray, kind: str, shape) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape)


def test_q6_k_is_re_quantized_to_8_bits_within_half_a_step():
    raw = random_blocks("Q6_K")
    values, bits = ours(raw, "Q6_K")
    assert bits == 8
    ref = reference(raw, "Q6_K").reshape(-1, 32)
    step = (ref.max(-1) - ref.min(-1)) / 255
    error = np.abs(values.reshape(-1, 32) - ref)
    assert (error <= step[:, None] * 0.5 * (1 + 1e-4)).all()  # float32 rounding


def test_q6_k_error_on_weights_is_small_against_its_own():
    """On normal weights: the 8-bit re-quantization adds < 1/4 of Q6_K's own error."""
    weights = np.random.default_rng(2).normal(size=(ROWS, COLS)).astype(np.float32)
    raw = gguf_kquants.quantize(weights, "Q6_K")
    q6 = reference_of(raw, "Q6_K", weights.shape)
    values, _ = ours(raw, "Q6_K")
    own = np.sqrt(np.mean((q6 - weights) ** 2))
    added = np.sqrt(np.mean((values - q6) ** 2))
    assert added < 0.25 * own, (added, own)


@pytest.mark.parametrize("kind,levels", [("F32", np.float32), ("F16", np.float16)])
def test_dense_types(kind, levels):
    weights = np.random.default_rng(3).normal(size=(3, 64)).astype(levels)
    qtype = int(gguf.GGMLQuantizationType[kind])
    tensor = to_mlx(weights.reshape(-1).view(np.uint8), qtype, (3, 64))
    assert tensor.bits is None
    np.testing.assert_array_equal(np.array(tensor.arrays["weight"]), weights)


def test_bf16_is_exact():
    weights = np.random.default_rng(4).normal(size=(2, 32)).astype(np.float32)
    bits = (weights.view(np.uint32) >> 16).astype(np.uint16)
    tensor = to_mlx(bits.view(np.uint8).reshape(-1), 30, (2, 32))
    assert tensor.arrays["weight"].dtype == mx.bfloat16
    expected = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(np.array(tensor.arrays["weight"].astype(mx.float32)), expected)


@pytest.mark.parametrize("kind", [*EXACT, "Q6_K", "F16", "F32", "BF16"])
def test_byte_size_matches_gguf(kind):
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert byte_size(int(qtype), (7, 512)) == 7 * 512 // block * size


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        to_mlx(np.zeros(144, np.uint8), 12, (1, 128))


def test_mxfp4_keeps_every_code_and_exponent():
    """Random bytes: every E2M1 code in both nibbles, exponents across E8M0's range
    (denormal 2^-127 included); MLX's mxfp4 dequantization equals gguf's exactly."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (ROWS * COLS // 32, 17), dtype=np.uint8)
    raw[:, 0] = rng.integers(0, 160, len(raw))
    tensor = to_mlx(raw.reshape(-1), int(gguf.GGMLQuantizationType.MXFP4), (ROWS, COLS))
    assert (tensor.bits, tensor.mode) == (4, "mxfp4") and "biases" not in tensor.arrays
    a = tensor.arrays
    values = mx.dequantize(a["weight"], a["scales"], group_size=32, bits=4, mode="mxfp4",
                           dtype=mx.float32)
    np.testing.assert_array_equal(np.array(values), reference(raw.reshape(ROWS, -1), "MXFP4"))
