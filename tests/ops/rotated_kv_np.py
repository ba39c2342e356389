"""Numpy codec of the rotated low-bit KV codes (vllm_metal/attention/rotated_kv.py
defines them): float64 arithmetic, float16 side values, a row on the last axis
([..., head_dim]; everything before it is kept)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.ops.kv_quant_np import decoded_rows
from vllm_metal.attention.rotated_kv import RotatedPreset, hadamard, lloyd_max_levels


@dataclass(frozen=True)
class KeyCodes:
    """index uint8 [..., d] (into the levels) and norm float16 [...]."""

    index: np.ndarray
    norm: np.ndarray


def encode_keys(k: np.ndarray, bits: int) -> KeyCodes:
    """Keys [..., d] -> their codes (rotated_kv's docstring)."""
    k = np.asarray(k, dtype=np.float64)
    d = k.shape[-1]
    rotated = k @ hadamard(d)
    norm = np.linalg.norm(rotated, axis=-1)
    norm16 = norm.astype(np.float16)
    unit = rotated / np.where(norm > 0, norm, 1.0)[..., None]
    levels = lloyd_max_levels(d, bits)
    index = np.searchsorted((levels[:-1] + levels[1:]) / 2, unit).astype(np.uint8)
    return KeyCodes(index, norm16)


def key_factor(codes: KeyCodes, bits: int, norm_correction: bool) -> np.ndarray:
    """float64 [...]: what multiplies the picked levels: the norm, or with norm
    correction the norm / |levels picked|."""
    factor = codes.norm.astype(np.float64)
    if norm_correction:
        levels = lloyd_max_levels(codes.index.shape[-1], bits)
        factor = factor / np.linalg.norm(levels[codes.index], axis=-1)
    return factor


def decode_keys(codes: KeyCodes, bits: int, norm_correction: bool) -> np.ndarray:
    """float64 [..., d]: the keys the codes stand for, rotated back."""
    d = codes.index.shape[-1]
    factor = key_factor(codes, bits, norm_correction)
    return (lloyd_max_levels(d, bits)[codes.index] * factor[..., None]) @ hadamard(d)


@dataclass(frozen=True)
class ValueCodes:
    """code uint8 [..., d], step and minimum float16 [...]."""

    code: np.ndarray
    step: np.ndarray
    minimum: np.ndarray


def encode_values(v: np.ndarray, bits: int) -> ValueCodes:
    """Values [..., d] -> their codes (rotated_kv's docstring); ties round to the even
    code."""
    v = np.asarray(v, dtype=np.float64)
    top = (1 << bits) - 1
    lo, hi = v.min(axis=-1), v.max(axis=-1)
    minimum = lo.astype(np.float16)
    step = ((hi - lo) / top).astype(np.float16)
    s = step.astype(np.float64)[..., None]
    ratio = (v - minimum.astype(np.float64)[..., None]) / np.where(s > 0, s, 1.0)
    code = np.where(s > 0, np.clip(np.rint(ratio), 0, top), 0).astype(np.uint8)
    return ValueCodes(code, step, minimum)


def decode_values(codes: ValueCodes) -> np.ndarray:
    """float64 [..., d]."""
    return (codes.minimum.astype(np.float64)[..., None]
            + codes.code * codes.step.astype(np.float64)[..., None])


def round_trip(k: np.ndarray, v: np.ndarray, preset: RotatedPreset
               ) -> tuple[np.ndarray, np.ndarray]:
    """(keys, values) float64 as a cache of ``preset`` reads them back."""
    if preset.key_bits == 8:
        keys = decoded_rows(k, "fp8_e4m3")
    else:
        keys = decode_keys(encode_keys(k, preset.key_bits), preset.key_bits,
                           preset.norm_correction)
    return keys, decode_values(encode_values(v, preset.value_bits))
