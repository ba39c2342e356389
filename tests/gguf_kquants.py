"""Q4_K, Q5_K and Q6_K encoders for test files (the `gguf` package only decodes them).

Simple min/max quantizers in llama.cpp's block layouts; accuracy is not their point,
only valid blocks whose decoded values stay near the input. Tests check them with
`gguf.quants.dequantize` (the decoder llama.cpp's Python tools use).
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def quantize(array: np.ndarray, kind: str) -> np.ndarray:
    """float [rows, cols] (cols % 256 == 0) -> uint8 [rows, cols / 256 * block bytes]."""
    rows, cols = array.shape
    if cols % QK_K:
        raise ValueError(f"{kind} needs rows of a multiple of {QK_K} weights, got {cols}")
    blocks = np.asarray(array, np.float32).reshape(-1, QK_K)
    encoded = {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}[kind](blocks)
    return encoded.reshape(rows, -1)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _scale_min_blocks(blocks: np.ndarray, levels: int):
    """Per 32-weight group: 6-bit scale and min codes against fp16 super-scales."""
    groups = blocks.reshape(-1, 8, 32)
    low = np.minimum(groups.min(-1), 0.0)
    step = (groups.max(-1) - low) / levels
    d = (step.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (-low.min(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d == 0, 1, d)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-low / np.where(dmin == 0, 1, dmin)[:, None]), 0, 63).astype(np.uint8)
    scale = d[:, None] * sc
    offset = dmin[:, None] * mn
    q = np.round((groups + offset[..., None]) / np.where(scale == 0, 1, scale)[..., None])
    q = np.clip(q, 0, levels).astype(np.uint8)
    packed = np.zeros((len(blocks), 12), np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    head = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed], axis=1)
    return head, q


def _nibble_chunks(q: np.ndarray) -> np.ndarray:
    """[n, 8, 32] levels (low 4 bits) -> [n, 128]: groups 2c and 2c+1 share chunk c."""
    q = q & 15
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _scale_min_blocks(blocks, 15)
    return np.concatenate([head, _nibble_chunks(q)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _scale_min_blocks(blocks, 31)
    high = ((q >> 4) & 1).astype(np.uint8)  # [n, 8 groups, 32]
    qh = np.zeros((len(blocks), 32), np.uint8)
    for group in range(8):
        qh |= high[:, group] << group
    return np.concatenate([head, qh, _nibble_chunks(q)], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    groups = blocks.reshape(-1, 16, 16)
    step = np.abs(groups).max(-1) / 31.5
    d = (np.abs(step).max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d == 0, 1, d)[:, None]), -128, 127).astype(np.int8)
    scale = d[:, None] * sc
    q = np.round(groups / np.where(scale == 0, 1, scale)[..., None]) + 32
    q = np.clip(q, 0, 63).astype(np.uint8).reshape(-1, 2, 4, 32)  # [n, half, quarter, 32]
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6))
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                           _f16_bytes(d)], axis=1)
