"""The attention ops as lazy MLX graph nodes (native kernels of ``vllm_metal._ext``).

Both functions validate their arguments, raising ValueError/TypeError that name
the bad argument, cast int64 index arrays to int32, and return unevaluated
arrays: nothing here calls ``mx.eval``. Metadata that can only be checked on
data (slot or block ids out of range, ``seq_lens`` shorter than the query rows)
raises when the result is evaluated. vllm_metal.ops.reference holds pure-MLX
versions with the same signatures for float caches (quantized ones are held to a
numpy codec in tests/ops/kv_quant_np.py).

On macOS the ops run on the GPU through the kernels_v2 Metal kernels once
vllm_metal.native.get_ops() has loaded them, else on the CPU stream.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import mlx.core as mx

from vllm_metal import envs
from vllm_metal.attention import kv_quant as kv_quant_formats
from vllm_metal.attention.kv_quant import KvQuant
from vllm_metal.native import get_ops

__all__ = ["paged_attention", "reshape_and_cache"]

_FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
_INDEX_DTYPES = (mx.int32, mx.int64)


def reshape_and_cache(
    key: mx.array,
    value: mx.array,
    key_cache: mx.array,
    value_cache: mx.array,
    slot_mapping: mx.array,
    kv_quant: KvQuant | str | None = None,
    key_columns: bool = False,
) -> tuple[mx.array, mx.array]:
    """Write this step's K/V rows into the paged caches, in place.

    key, value:   [num_tokens, num_kv_heads, head_size], cast to the cache dtype
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size]
                  (with kv_quant: uint8 [..., kv_quant.key_width(head_size)] and
                  [..., value_width(head_size)], each row its codes and what
                  decodes them, attention.kv_quant)
    slot_mapping: int32/int64 [num_tokens]; slot = block_id * block_size + offset,
                  negative = padding, skipped
    kv_quant:     a quantized format (attention.kv_quant: "int8", "fp8_e4m3",
                  "fp8_e5m2", "rot4", "k8v4") or None for a float cache
    key_columns:  float caches, CPU: key_cache is [num_blocks, num_kv_heads,
                  head_size, block_size] (see paged_attention)
    Returns (key_cache, value_cache) after the write.

    The caches are not copied: the returned arrays share the input caches'
    buffers and the rows are written when they are evaluated (after which the
    input arrays show them too). Pass the returned arrays to later ops
    (paged_attention): that is what orders the write before the read in the
    graph. A slot >= num_blocks * block_size raises at evaluation, before
    anything is written.
    """
    _check_float("key", key, 3, "[num_tokens, num_kv_heads, head_size]")
    _check_float("value", value, 3, "[num_tokens, num_kv_heads, head_size]")
    quant = kv_quant_formats.resolve(kv_quant)
    _check_cache_pair(key_cache, value_cache, quant, key_columns)
    if value.shape != key.shape:
        raise ValueError(f"value shape {value.shape} must equal key shape {key.shape}")
    _check_widths(key.shape[1], key.shape[2], key_cache, value_cache, quant,
                  f"key [num_tokens, num_kv_heads, head_size] = {key.shape}", key_columns)
    slot_mapping = _index("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} entries but key has "
            f"{key.shape[0]} tokens")
    return get_ops().reshape_and_cache(
        key, value, key_cache, value_cache, slot_mapping, kv_quant=_code(quant),
        key_columns=bool(key_columns), stream=_stream())


def paged_attention(
    query: mx.array,
    key_cache: mx.array,
    value_cache: mx.array,
    block_tables: mx.array,
    seq_lens: mx.array,
    cu_seqlens_q: mx.array,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
    kv_quant: KvQuant | str | None = None,
    key_columns: bool = False,
    key_ends: mx.array | None = None,
) -> mx.array:
    """Causal attention of a packed varlen batch through block tables.

    query:        [total_q, num_heads, head_size]
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size]
                  (with kv_quant: uint8 [..., row width], as reshape_and_cache
                  writes them)
    block_tables: int32 [num_seqs, max_blocks]
    seq_lens:     int32 [num_seqs], context length including this step's tokens
    cu_seqlens_q: int32 [num_seqs + 1], query row offsets of each sequence
    sliding_window: W keeps the last W positions (p - W + 1 .. p)
    softcap:      scores become c * tanh(s / c)
    sinks:        [num_heads] float, one extra logit per head in the softmax
                  denominator (contributes nothing to the output)
    key_columns:  the CPU backend's key layout for float caches at head sizes
                  64, 128 and 256: key_cache is [num_blocks, num_kv_heads,
                  head_size, block_size], each page's keys as columns, so one
                  vector load holds a dimension of consecutive keys (the CPU
                  kernel then needs no lane reduction per key); value_cache
                  keeps rows. The Metal kernels read rows only.
    key_ends:     int32 [total_q] or None: row r also attends to the positions
                  after its own up to key_ends[r] - 1 (capped at its context): the
                  rows of a span attending bidirectionally (a prefix-LM's image
                  tokens) each name the span's end; other rows anything <= their
                  position + 1. The sliding window still counts back from the row.
    Returns [total_q, num_heads, head_size] in query's dtype.

    Query row j of sequence i sits at position seq_lens[i] - q_len_i + j and
    attends to positions <= it. num_heads must be a multiple of num_kv_heads.
    """
    _check_float("query", query, 3, "[total_q, num_heads, head_size]")
    quant = kv_quant_formats.resolve(kv_quant)
    _check_cache_pair(key_cache, value_cache, quant, key_columns)
    num_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads = value_cache.shape[2]
    _check_widths(num_kv_heads, head_size, key_cache, value_cache, quant,
                  f"query head_size {head_size}", key_columns)
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"query num_heads ({num_heads}) must be a multiple of key_cache "
            f"num_kv_heads ({num_kv_heads})")
    block_tables = _index("block_tables", block_tables, 2)
    seq_lens = _index("seq_lens", seq_lens, 1)
    cu_seqlens_q = _index("cu_seqlens_q", cu_seqlens_q, 1)
    num_seqs = block_tables.shape[0]
    if seq_lens.shape[0] != num_seqs:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} entries but block_tables has {num_seqs} rows")
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        raise ValueError(
            f"cu_seqlens_q must have num_seqs + 1 = {num_seqs + 1} entries, "
            f"got {cu_seqlens_q.shape[0]}")
    scale = _positive_float("scale", scale)
    if sliding_window is not None:
        if not isinstance(sliding_window, Integral) or isinstance(sliding_window, bool):
            raise TypeError(f"sliding_window must be an int or None, got {sliding_window!r}")
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 (or None), got {sliding_window}")
        sliding_window = int(sliding_window)
    if softcap is not None:
        softcap = _positive_float("softcap", softcap)
    _ = envs.VLLM_METAL_DISABLE_GQA_DECODE  # a bad value fails here, not inside the graph
    if sinks is not None:
        if not isinstance(sinks, mx.array):
            raise TypeError(f"sinks must be an mx.array or None, got {type(sinks).__name__}")
        if sinks.shape != (num_heads,):
            raise ValueError(f"sinks must be [num_heads] = ({num_heads},), got {sinks.shape}")
        if sinks.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"sinks must be a float array, got {sinks.dtype}")
        sinks = sinks.astype(mx.float32)
    if key_ends is not None:
        key_ends = _index("key_ends", key_ends, 1)
        if key_ends.shape[0] != query.shape[0]:
            raise ValueError(f"key_ends must be [total_q] = ({query.shape[0]},), "
                             f"got {key_ends.shape}")
    return get_ops().paged_attention(
        query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, scale,
        sliding_window, softcap, sinks, kv_quant=_code(quant), key_columns=bool(key_columns),
        key_ends=key_ends, stream=_stream())


def _stream() -> mx.DeviceType | None:
    # With the Metal kernels loaded the ops run on the default (GPU) stream and
    # fall back to the CPU per call for shapes the kernels do not cover; without
    # them, on the CPU stream (unified memory: no copies).
    return None if get_ops().metal_kernels_loaded() else mx.cpu


def _check_float(name: str, x: object, ndim: int, layout: str) -> None:
    if not isinstance(x, mx.array):
        raise TypeError(f"{name} must be an mx.array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {x.shape}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")


# The CPU pieces kernel reads key columns, as it alone reads 4-bit rows.
KEY_COLUMN_HEAD_SIZES = kv_quant_formats.PACKED_HEAD_SIZES


def _key_rows_shape(key_cache: mx.array, key_columns: bool) -> tuple[int, ...]:
    """key_cache's shape in the row layout's order [blocks, block_size, heads, width]."""
    if not key_columns:
        return tuple(key_cache.shape)
    blocks, heads, width, block_size = key_cache.shape
    return (blocks, block_size, heads, width)


def _check_widths(num_kv_heads: int, head_size: int, key_cache: mx.array, value_cache: mx.array,
                  quant: KvQuant | None, what: str, key_columns: bool = False) -> None:
    """ValueError unless the caches' heads and row widths are those of ``quant``."""
    if key_columns and head_size not in KEY_COLUMN_HEAD_SIZES:
        raise ValueError(f"{what}: key columns take head sizes {KEY_COLUMN_HEAD_SIZES}")
    if quant is None:
        widths, names = (head_size, head_size), ("head_size", "head_size")
    else:
        widths = (quant.key_width(head_size), quant.value_width(head_size))
        names = tuple("head_size / 2 + 4" if nib else "head_size + 4"
                      for nib in (quant.key_nibbles, quant.value_nibbles))
    shapes = (_key_rows_shape(key_cache, key_columns), tuple(value_cache.shape))
    for shape, name, width, label in zip(shapes, ("key", "value"), widths, names):
        if (num_kv_heads, width) != shape[2:]:
            layout = (f"[..., num_kv_heads, {label}]" if name == "value" or not key_columns
                      else f"[num_blocks, num_kv_heads, {label}, block_size]")
            raise ValueError(f"{what} does not match {name}_cache {layout}: "
                             f"needs rows of {width} for {num_kv_heads} heads, got {shape}")


def _code(quant: KvQuant | None) -> int:
    return 0 if quant is None else quant.code


def _check_cache_pair(key_cache: object, value_cache: object,
                      quant: KvQuant | None = None, key_columns: bool = False) -> None:
    layout = "[num_blocks, block_size, num_kv_heads, head_size]"
    if key_columns and quant is not None:
        raise ValueError(f"key columns hold float caches only, not a {quant.name} cache")
    if quant is None:
        _check_float("key_cache", key_cache, 4, layout)
        _check_float("value_cache", value_cache, 4, layout)
    else:
        for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
            if not isinstance(cache, mx.array):
                raise TypeError(f"{name} must be an mx.array, got {type(cache).__name__}")
            if cache.ndim != 4 or cache.dtype != kv_quant_formats.STORAGE_DTYPE:
                raise TypeError(
                    f"{name} of a {quant.name} cache must be uint8 [num_blocks, block_size, "
                    f"num_kv_heads, row width], got {cache.dtype} {cache.shape}")
    # Row widths may differ (k8v4); _check_widths holds each to its format.
    if value_cache.shape[:3] != _key_rows_shape(key_cache, key_columns)[:3]:
        raise ValueError(
            f"value_cache shape {value_cache.shape} must match key_cache shape "
            f"{key_cache.shape} in blocks, block size and heads"
            + (" (key columns: [num_blocks, num_kv_heads, head_size, block_size])"
               if key_columns else ""))
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(
            f"value_cache dtype {value_cache.dtype} must equal key_cache dtype "
            f"{key_cache.dtype}")


def _index(name: str, x: object, ndim: int) -> mx.array:
    if not isinstance(x, mx.array):
        raise TypeError(f"{name} must be an mx.array, got {type(x).__name__}")
    if x.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    return x if x.dtype == mx.int32 else x.astype(mx.int32)


def _positive_float(name: str, x: object) -> float:
    if not isinstance(x, Real) or isinstance(x, bool):
        raise TypeError(f"{name} must be a number, got {x!r}")
    value = float(x)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return value
