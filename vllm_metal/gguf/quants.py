"""GGML tensor blocks -> MLX parameters: dense arrays or affine-quantized triples.

MLX's affine format is w = scale * q + bias per group of 32 weights (q unsigned, packed
into uint32 words, element i of a word at bits i * bits). Every GGML type whose blocks
are groups of 32 with one scale and one offset maps onto it exactly:

  Q4_0, Q4_1, Q4_K        -> 4-bit, group 32 (Q4_K: scale d*sc, bias -dmin*m per 32)
  Q8_0, Q5_0, Q5_1, Q5_K  -> 8-bit, group 32 (5-bit levels sit in 8-bit words: the CPU
                             fast path has 4- and 8-bit kernels, not 5-bit ones)
  Q6_K                    -> 8-bit, group 32, nearest: its scales are per 16 weights,
                             which no MLX group size holds; re-quantized from the exact
                             float values (error measured in docs/supported_models.md)
  MXFP4                   -> MLX's mxfp4 mode: the same E2M1 codes and E8M0 scale per 32
                             weights, only the nibbles reordered (exact)

Scales and offsets are computed in float32 and rounded only when the model is cast to
its serving dtype. We decode the blocks ourselves rather than dequantize with the `gguf`
package because the exact mapping keeps the integer levels (no float round trip, no
full-precision copy of a multi-gigabyte file); `gguf`'s dequantizer is the reference
the tests compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from vllm_metal.gguf.header import GGML_TYPE_NAMES

GROUP_SIZE = 32
_F32, _F16, _BF16 = 0, 1, 30
DENSE_TYPES = (_F32, _F16, _BF16)
# type id -> (weights per block, bytes per block)
_MXFP4 = 39
_BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
           12: (256, 144), 13: (256, 176), 14: (256, 210), _MXFP4: (32, 17)}
QUANTIZED_TYPES = tuple(_BLOCKS)
SUPPORTED_TYPES = tuple(GGML_TYPE_NAMES[t] for t in (*DENSE_TYPES, *QUANTIZED_TYPES))
NEAREST_TYPES = ("Q6_K",)


@dataclass(frozen=True)
class MLXTensor:
    """One GGUF tensor as MLX parameters.

    `arrays`: {"weight": ...} (dense, float32/bfloat16 [*shape]) or {"weight": uint32
    [rows, in * bits / 32], "scales"/"biases": float32 [rows, in / 32]}; `bits` None
    when dense.
    """

    arrays: dict[str, mx.array]
    bits: int | None = None
    mode: str = "affine"  # or "mxfp4": {"weight", "scales" uint8 E8M0}, no biases


def byte_size(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of `shape` (numpy order) and type occupies in the file."""
    count = int(np.prod(shape, dtype=np.int64))
    if ggml_type in (_F32,):
        return 4 * count
    if ggml_type in (_F16, _BF16):
        return 2 * count
    block, size = _BLOCKS[ggml_type]
    return count // block * size


def to_mlx(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> MLXTensor:
    """`raw`: the tensor's bytes (uint8 [byte_size]); `shape` in numpy order."""
    if ggml_type == _F32:
        return MLXTensor({"weight": mx.array(raw.view(np.float32).reshape(shape))})
    if ggml_type == _F16:
        return MLXTensor({"weight": mx.array(raw.view(np.float16).reshape(shape))})
    if ggml_type == _BF16:  # bf16 bits are the high half of a float32
        wide = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return MLXTensor({"weight": mx.array(wide.reshape(shape)).astype(mx.bfloat16)})
    if ggml_type not in _BLOCKS:
        raise ValueError(f"GGML type {GGML_TYPE_NAMES.get(ggml_type, ggml_type)} "
                         "has no MLX conversion")
    block, size = _BLOCKS[ggml_type]
    if len(shape) != 2 or shape[1] % block:
        raise ValueError(f"{GGML_TYPE_NAMES[ggml_type]} tensor of shape {shape}: expected "
                         f"2-D rows of a multiple of {block} weights")
    rows, cols = shape
    blocks = raw.reshape(-1, size)
    if ggml_type == 14:
        return _nearest_8bit(blocks, rows, cols)
    if ggml_type == _MXFP4:
        # Byte 0 of a block is the E8M0 exponent; byte 1 + j holds weight j in its low
        # nibble and weight j + 16 in its high one (ggml's block_mxfp4).
        return MLXTensor({
            "weight": mx.array(_pack(_nibbles(blocks[:, 1:17]).reshape(rows, cols), 4)),
            "scales": mx.array(np.ascontiguousarray(blocks[:, 0]).reshape(rows, cols // 32)),
        }, 4, "mxfp4")
    levels, scales, biases = _DECODERS[ggml_type](blocks)
    bits = 4 if ggml_type in (2, 3, 12) else 8
    return MLXTensor({
        "weight": mx.array(_pack(levels.reshape(rows, cols), bits)),
        "scales": mx.array(scales.reshape(rows, cols // GROUP_SIZE)),
        "biases": mx.array(biases.reshape(rows, cols // GROUP_SIZE)),
    }, bits)


def _pack(levels: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [rows, cols] levels -> uint32 [rows, cols * bits / 32], little-endian first."""
    if bits == 4:
        levels = levels[:, 0::2] | (levels[:, 1::2] << 4)
    return np.ascontiguousarray(levels).view(np.uint32)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """float32 [n, 1]: the fp16 at byte `start` of each block."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] levels: low nibbles are weights 0-15, high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian uint32) -> [n, 32] bit j of it, as 0 or 16."""
    word = qh.copy().view(np.uint32)
    return (((word >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q4_0(b):
    d = _half(b, 0)
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b):
    return _nibbles(b[:, 4:20]), _half(b, 0), _half(b, 2)


def _q5_0(b):
    d = _half(b, 0)
    return _nibbles(b[:, 6:22]) | _fifth_bits(b[:, 2:6]), d, -16 * d


def _q5_1(b):
    return _nibbles(b[:, 8:24]) | _fifth_bits(b[:, 4:8]), _half(b, 0), _half(b, 2)


def _q8_0(b):
    d = _half(b, 0)
    return (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: per 32-weight group (scale, bias), each float32 [n, 8].

    12 bytes hold eight 6-bit scales and eight 6-bit mins: groups 0-3 in the low 6 bits
    of bytes 0-3 (scales) and 4-7 (mins); groups 4-7 take their low 4 bits from bytes
    8-11 and their top 2 bits from the spare top bits of bytes 0-7.
    """
    d, dmin, s = _half(b, 0), _half(b, 2), b[:, 4:16]
    scale = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], 1)
    low = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
    return d * scale, -dmin * low


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: chunk c's low nibbles are group 2c, high ones 2c+1."""
    chunks = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b):
    scale, bias = _k_scales(b)
    return _k_nibbles(b[:, 16:144]), scale, bias


def _q5_k(b):
    scale, bias = _k_scales(b)
    high = (b[:, 16:48][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return _k_nibbles(b[:, 48:176]) | (high << 4), scale, bias


def _nearest_8bit(blocks: np.ndarray, rows: int, cols: int) -> MLXTensor:
    """Q6_K -> 8-bit affine per 32 weights: offset the group's minimum, 255 steps to its
    maximum, so no weight moves more than half a step (mx.quantize keeps zero exact
    instead, which can cost a whole step)."""
    import gguf

    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q6_K)
    groups = mx.array(values).reshape(-1, GROUP_SIZE)  # MLX: threaded, 4x numpy here
    low, high = groups.min(1, keepdims=True), groups.max(1, keepdims=True)
    scale = (high - low) / 255
    levels = mx.round((groups - low) / mx.where(scale == 0, 1, scale)).astype(mx.uint8)
    return MLXTensor({
        "weight": mx.array(_pack(np.array(levels).reshape(rows, cols), 8)),
        "scales": scale.reshape(rows, cols // GROUP_SIZE),
        "biases": low.reshape(rows, cols // GROUP_SIZE),
    }, 8)


_DECODERS = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 12: _q4_k, 13: _q5_k}
