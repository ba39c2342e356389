"""The rotated low-bit KV codes (vllm_metal/attention/rotated_kv.py) and their numpy
codec (tests/ops/rotated_kv_np.py), against facts from outside the code: Max's
published Lloyd-Max quantizers of the unit Gaussian, the Sylvester-Hadamard entries
by bit parity, brute-force nearest levels, and the step bound of uniform codes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.ops import rotated_kv_np as codec
from vllm_metal.attention import rotated_kv

# J. Max, "Quantizing for minimum distortion" (1960), Table I: the positive output
# levels of the minimum mean-squared-error quantizer of N(0, 1).
MAX_1960 = {
    1: [0.7979],
    2: [0.4528, 1.5104],
    3: [0.2451, 0.7560, 1.3440, 2.1520],
    4: [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326],
}


@pytest.mark.parametrize("bits", sorted(MAX_1960))
def test_levels_are_max_s_gaussian_quantizers(bits):
    got = rotated_kv.lloyd_max_levels(1, bits)
    half = np.array(MAX_1960[bits])
    np.testing.assert_allclose(got, np.concatenate([-half[::-1], half]), atol=1.5e-4)
    # N(0, 1/d): the same levels scaled by 1/sqrt(d).
    np.testing.assert_allclose(rotated_kv.lloyd_max_levels(64, bits), got / 8.0, rtol=1e-12)


@pytest.mark.parametrize("bits", [3, 4])
def test_each_level_is_the_mean_of_its_cell(bits):
    # The Lloyd-Max condition by numerical integration on a fine grid.
    levels = rotated_kv.lloyd_max_levels(1, bits)
    edges = np.concatenate([[-12.0], (levels[:-1] + levels[1:]) / 2, [12.0]])
    for i, level in enumerate(levels):
        x = np.linspace(edges[i], edges[i + 1], 200001)
        w = np.exp(-x * x / 2)
        assert abs(np.trapezoid(x * w, x) / np.trapezoid(w, x) - level) < 1e-8


@pytest.mark.parametrize("d", [2, 16, 64, 128, 256])
def test_hadamard_is_sylvester_s_orthonormal_matrix(d):
    h = rotated_kv.hadamard(d)
    i, j = np.indices((d, d))
    parity = np.vectorize(lambda a: bin(a).count("1") % 2)(i & j)
    np.testing.assert_array_equal(h, np.where(parity, -1.0, 1.0) / math.sqrt(d))
    np.testing.assert_allclose(h @ h, np.eye(d), atol=1e-12)


@pytest.mark.parametrize("d", [0, 1, 80, 96, 112])
def test_head_sizes_without_a_hadamard_rotation_are_refused(d):
    with pytest.raises(ValueError, match=f"power-of-2 head size, got {d}"):
        rotated_kv.check_head_size(d)


def rows(shape, seed=0, scale=3.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("nc", [False, True])
def test_keys_take_the_nearest_level_of_their_rotated_direction(bits, nc):
    k = rows((50, 64))
    codes = codec.encode_keys(k, bits)
    unit = k @ rotated_kv.hadamard(64)
    unit /= np.linalg.norm(unit, axis=-1, keepdims=True)
    levels = rotated_kv.lloyd_max_levels(64, bits)
    want = np.abs(unit[..., None] - levels).argmin(-1)
    np.testing.assert_array_equal(codes.index, want)
    np.testing.assert_array_equal(codes.norm, np.linalg.norm(k, axis=-1).astype(np.float16))
    decoded = codec.decode_keys(codes, bits, nc)
    length = np.linalg.norm(decoded, axis=-1)
    if nc:  # the decoded key keeps the stored norm exactly
        np.testing.assert_allclose(length, codes.norm.astype(np.float64), rtol=1e-12)
    # What attention computes: the rotated query against the levels equals the
    # query against the decoded key.
    q = rows((50, 64), seed=1)
    rotated_q = q @ rotated_kv.hadamard(64)
    scores = (rotated_q * levels[codes.index]).sum(-1) * codec.key_factor(codes, bits, nc)
    np.testing.assert_allclose(scores, (q * decoded).sum(-1), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bits,bound", [(3, 0.22), (4, 0.12)])
def test_gaussian_keys_come_back_within_the_quantizer_s_error(bits, bound):
    k = rows((2000, 128), seed=2)
    got = codec.decode_keys(codec.encode_keys(k, bits), bits, True)
    assert np.linalg.norm(got - k) / np.linalg.norm(k) < bound


def test_a_zero_key_reads_back_as_zero():
    codes = codec.encode_keys(np.zeros((3, 64)), 4)
    assert not codec.decode_keys(codes, 4, True).any()


@pytest.mark.parametrize("bits", [3, 4])
def test_values_stay_within_half_a_step_of_their_float16_grid(bits):
    v = rows((300, 64), seed=3)
    codes = codec.encode_values(v, bits)
    assert codes.code.max() <= (1 << bits) - 1
    step = codes.step.astype(np.float64)[..., None]
    got = codec.decode_values(codes)
    # The grid starts at the float16 minimum: within half a step of it, except where
    # float16's rounding of the minimum and the step moved the row's ends.
    inside = (v >= codes.minimum.astype(np.float64)[..., None]) & (
        v <= got.max(-1, keepdims=True))
    assert np.all(np.abs(got - v)[inside] <= step.repeat(64, -1)[inside] / 2 * (1 + 1e-9))
    assert np.abs(got - v).max() <= step.max() * 0.51 + 1e-2


def test_constant_values_come_back_exactly_and_ties_go_to_the_even_code():
    codes = codec.encode_values(np.full((2, 8), 1.5), 4)
    assert not codes.step.any()
    np.testing.assert_array_equal(codec.decode_values(codes), np.full((2, 8), 1.5))
    # min 0, max 15 -> step 1; 0.5 and 2.5 sit halfway between codes.
    tied = codec.encode_values(np.array([[0.0, 0.5, 2.5, 15.0]]), 4)
    np.testing.assert_array_equal(tied.code, [[0, 0, 2, 15]])


def test_presets_are_vllm_s_names():
    from vllm.config.cache import CacheDType
    import typing

    assert set(rotated_kv.PRESETS) <= set(typing.get_args(CacheDType))
    assert {p.key_bits for p in rotated_kv.PRESETS.values()} == {3, 4, 8}
