"""Rotated low-bit KV codes, vLLM's ``--kv-cache-dtype turboquant_*`` presets: what
they store, the rotation and the key levels (tests/ops/rotated_kv_np.py is the numpy
codec written from this definition).

Keys (3 or 4 bits): the row is rotated by the orthonormal Hadamard matrix of the head
size and split into its norm and its direction. After the rotation every coordinate of
a unit direction is close to N(0, 1/d), so each takes the nearest of the 2^b Lloyd-Max
levels of that Gaussian (the levels minimising the mean squared error). The norm is
kept as float16. With norm correction (the ``_nc`` presets) the decoded direction,
the picked levels, is first scaled back to unit length. A rotation keeps dot
products, so attention can score the rotated query against the codes directly:
``q . k = (H q) . (H k)``.

Keys of 8 bits (``turboquant_k8v4``) are not rotated: e4m3 codes with a row scale,
as ``--kv-cache-dtype fp8`` stores them.

Values (3 or 4 bits): 2^b evenly spaced levels from the row's minimum to its maximum;
the step and the minimum are kept as float16 and the codes are taken against those
rounded numbers, so decoding (``minimum + code * step``) is what was encoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class RotatedPreset:
    """One ``--kv-cache-dtype turboquant_*`` preset."""

    name: str
    key_bits: int          # 8: e4m3 keys with a row scale, no rotation; 3-4: Lloyd-Max
    value_bits: int        # 3-4: uniform levels
    norm_correction: bool  # decoded key directions rescaled to unit length


PRESETS = {p.name: p for p in (
    RotatedPreset("turboquant_k8v4", 8, 4, False),
    RotatedPreset("turboquant_4bit_nc", 4, 4, True),
    RotatedPreset("turboquant_k3v4_nc", 3, 4, True),
    RotatedPreset("turboquant_3bit_nc", 3, 3, True),
)}


def check_head_size(head_size: int) -> None:
    """ValueError unless the Hadamard rotation exists for head_size (a power of 2)."""
    if head_size < 2 or head_size & (head_size - 1):
        raise ValueError(f"rotated KV codes need a power-of-2 head size, got {head_size}")


@lru_cache(maxsize=None)
def hadamard(d: int) -> np.ndarray:
    """float64 [d, d]: the orthonormal Hadamard matrix (Sylvester's construction,
    scaled by 1/sqrt(d)); symmetric, so it is its own inverse."""
    check_head_size(d)
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    out = h / math.sqrt(d)
    out.setflags(write=False)
    return out


def _gauss_interval(a: float, b: float, sigma: float) -> tuple[float, float]:
    """(mass, first moment) of N(0, sigma^2) on [a, b] (a, b may be infinite)."""
    def cdf(x):
        return 0.5 * (1.0 + math.erf(x / (sigma * math.sqrt(2.0))))

    def pdf_scaled(x):  # sigma^2 * density at x
        return 0.0 if math.isinf(x) else sigma / math.sqrt(2.0 * math.pi) * math.exp(
            -0.5 * (x / sigma) ** 2)

    return cdf(b) - cdf(a), pdf_scaled(a) - pdf_scaled(b)


@lru_cache(maxsize=None)
def lloyd_max_levels(d: int, bits: int) -> np.ndarray:
    """float64 [2^bits], ascending: the Lloyd-Max quantizer of N(0, 1/d), by Lloyd's
    iteration (each level the mean of its interval, each boundary the midpoint of two
    levels) with the Gaussian's interval means in closed form."""
    n = 1 << bits
    sigma = 1.0 / math.sqrt(d)
    levels = np.linspace(-2.0, 2.0, n) * sigma
    # Lloyd's iteration converges linearly (about 700 steps for 16 levels to move
    # less than 1e-13 sigma, leaving the levels ~1e-12 from the fixed point: far
    # below float32's resolution, which is what the kernels use).
    for _ in range(10000):
        edges = [-math.inf, *((levels[:-1] + levels[1:]) / 2), math.inf]
        new = np.array([m1 / m0 for m0, m1 in
                        (_gauss_interval(edges[i], edges[i + 1], sigma) for i in range(n))])
        done = np.max(np.abs(new - levels)) < 1e-13 * sigma
        levels = new
        if done:
            break
    levels.setflags(write=False)
    return levels
