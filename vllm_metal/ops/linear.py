"""The linear-layer ops as lazy MLX graph nodes (CPU kernels of ``vllm_metal._ext``).

``quantized_matmul`` and ``dense_matmul`` compute ``x @ W.T`` with fp32
accumulation, ``embedding_gather`` reads rows of a dense or quantized table.
Each validates its arguments (ValueError/TypeError naming the bad one) and
returns an unevaluated array; nothing here calls ``mx.eval``. Ids outside the
table raise when the result is evaluated. vllm_metal.ops.reference holds the
pure-MLX versions.

These are CPU kernels and run on the CPU stream. The CPU backend's fast linears
(vllm_metal/cpu/fast_linears.py) call them with ``validate=False``: they check a
layer's weights once, when they switch it, and a decode step makes ~200 calls;
the extension still checks every shape and dtype itself.
"""

from __future__ import annotations

import math
from numbers import Integral

import mlx.core as mx

from vllm_metal.native import get_ops

__all__ = ["dense_matmul", "embedding_gather", "quantized_matmul", "tile_quantized",
           "untile_quantized"]

_FLOAT_DTYPES = (mx.float32, mx.bfloat16, mx.float16)
_ID_DTYPES = (mx.int32, mx.int64, mx.uint32, mx.int16, mx.uint16, mx.int8, mx.uint8)
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
# Rows per tile of the int8 kernels' weight order (tile_quantized).
TILE_ROWS = 16


def quantized_matmul(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, *,
                     bits: int, group_size: int, bias: mx.array | None = None,
                     int8_activations: bool = False, zero_point: float = 0.0,
                     argmax_columns: int = 0, argmax_allowed: mx.array | None = None,
                     tiled: bool = False, validate: bool = True) -> mx.array:
    """``x @ W.T`` for an MLX affine-quantized ``W`` (``mx.quantize`` layout).

    x:      [..., K] float32/bfloat16/float16
    w:      uint32 [N, K * bits / 32]; field j of a word (lowest bits first) is column
            32 / bits * word + j
    scales, biases: [N, K / group_size], one float dtype; W = scales * q + biases
    bias:   optional [N] float, added to every row
    Returns [..., N], accumulated in float32, in MLX's promotion of the x, scales
    and bias dtypes (as nn.QuantizedLinear returns: x's dtype when they agree).
    int8_activations: round x to int8 per 32 columns (step max|x| / 127) and
    multiply in integers (csrc/cpu/linear/linear_q8.h); faster, ~1e-3 relative error.
    biases=None, only with int8_activations: symmetric weights (GGUF's Q8_0 and
    Q4_0, W = scales * (q - zero_point)); the kernels form each bias as
    -zero_point * scale instead of reading it.
    argmax_columns > 0 (at most N; x, scales and bias must promote to float32):
    returns int32 [...] instead, each row's ``mx.argmax`` over its first
    argmax_columns products (the first NaN, else the first maximum), without a
    logits array: greedy decoding straight from the head.
    argmax_allowed (with argmax_columns): uint32 [..., >= ceil(argmax_columns / 32)]
    over x's leading shape, a grammar's bitmask (bit c % 32 of word c / 32 admits
    column c); the columns it does not admit count as -inf.
    tiled (only with int8_activations): w, scales and biases come from
    ``tile_quantized``; the result is the same, bit for bit, and a few rows of x
    (decode) run faster than from MLX's layout.
    validate=False skips the Python checks (see the module docstring).
    """
    if validate:
        _check_tiled(tiled, int8_activations)
        bits, group_size = _check_quantized_matmul(x, w, scales, biases, bits, group_size, bias,
                                                   int8_activations, zero_point, argmax_columns)
        zero_point, argmax_columns = float(zero_point), int(argmax_columns)
        if argmax_allowed is not None:
            if not argmax_columns:
                raise ValueError("argmax_allowed needs argmax_columns > 0")
            _check_bitmask("argmax_allowed", argmax_allowed, x.shape[:-1], argmax_columns)
    return get_ops().quantized_matmul(x, w, scales, biases, bits, group_size, bias,
                                      int8_activations=int8_activations, zero_point=zero_point,
                                      argmax_columns=argmax_columns,
                                      argmax_allowed=argmax_allowed, tiled=tiled, stream=_CPU)


def tile_quantized(*arrays: mx.array | None) -> tuple[mx.array | None, ...]:
    """Each [..., N, P] array of a quantized matrix or of a stack of them (codes,
    scales, biases; None passes through) in the int8 kernels' tile order, same
    shape: rows are taken TILE_ROWS at a time and each tile's [rows, P] block is
    stored transposed, [P, rows] (the last tile may have fewer rows). One output
    column's codes then sit in one lane of every vector the kernel loads, and the
    kernel that serves one row of x is the one that serves many
    (csrc/cpu/linear/linear_q8.h). Rows cut at multiples of TILE_ROWS stay valid
    tiles. Returns lazy arrays."""
    return tuple(None if a is None else _tile(a) for a in arrays)


def untile_quantized(*arrays: mx.array | None) -> tuple[mx.array | None, ...]:
    """The inverse of ``tile_quantized``."""
    return tuple(None if a is None else _untile(a) for a in arrays)


def _tile(a: mx.array) -> mx.array:
    """[..., N, P]: each trailing [N, P] matrix tiled on its own."""
    *lead, n, p = a.shape
    a = a.reshape(-1, n, p)
    full = n // TILE_ROWS * TILE_ROWS
    parts = []
    if full:
        parts.append(a[:, :full].reshape(-1, full // TILE_ROWS, TILE_ROWS, p)
                     .swapaxes(2, 3).reshape(a.shape[0], -1))
    if full < n:
        parts.append(a[:, full:].swapaxes(1, 2).reshape(a.shape[0], -1))
    out = mx.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return out.reshape(*lead, n, p)


def _untile(a: mx.array) -> mx.array:
    *lead, n, p = a.shape
    flat = a.reshape(-1, n * p)
    full = n // TILE_ROWS * TILE_ROWS
    parts = []
    if full:
        parts.append(flat[:, :full * p].reshape(-1, full // TILE_ROWS, p, TILE_ROWS)
                     .swapaxes(2, 3).reshape(flat.shape[0], full, p))
    if full < n:
        parts.append(flat[:, full * p:].reshape(-1, p, n - full).swapaxes(1, 2))
    out = mx.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return mx.contiguous(out.reshape(*lead, n, p))


def _check_tiled(tiled: object, int8_activations: object) -> None:
    if not isinstance(tiled, bool):
        raise TypeError(f"tiled must be a bool, got {tiled!r}")
    if tiled and int8_activations is not True:
        raise ValueError("tiled=True (weights in tile_quantized's order) needs "
                         "int8_activations=True; untile_quantized gives MLX's layout back")


def _check_quantized_matmul(x, w, scales, biases, bits, group_size, bias, int8_activations,
                            zero_point, argmax_columns) -> tuple[int, int]:
    """Raises on a bad argument; returns (bits, group_size) as ints."""
    if not isinstance(int8_activations, bool):
        raise TypeError(f"int8_activations must be a bool, got {int8_activations!r}")
    bits = _choice("bits", bits, BITS)
    group_size = _choice("group_size", group_size, GROUP_SIZES)
    k = _float_input("x", x)
    _array("w", w)
    if w.dtype != mx.uint32 or w.ndim != 2:
        raise TypeError(f"w must be a 2-D uint32 array [N, K * bits / 32], got {w.dtype} "
                        f"{w.shape}")
    n = w.shape[0]
    if w.shape[1] * 32 != k * bits:
        raise ValueError(f"w [N, K * bits / 32] = {w.shape} does not match x's K = {k} at "
                         f"bits={bits}")
    groups_shape = (n, k // group_size)
    if k % group_size:
        raise ValueError(f"x's K = {k} is not a multiple of group_size {group_size}")
    for name, a in (("scales", scales), ("biases", biases)):
        if a is None and name == "biases":
            continue
        _float_array(name, a)
        if a.shape != groups_shape:
            raise ValueError(f"{name} must be [N, K / group_size] = {groups_shape}, got {a.shape}")
    _check_zero_point(zero_point, biases, int8_activations)
    if biases is not None and biases.dtype != scales.dtype:
        raise TypeError(f"biases dtype {biases.dtype} must equal scales dtype {scales.dtype}")
    _check_bias(bias, n)
    _check_argmax_columns(argmax_columns, n)
    return bits, group_size


def _check_bitmask(name: str, a: mx.array, rows: tuple, columns: int) -> None:
    """A bitmask over COLUMNS for each of ROWS (a shape): uint32 [*rows, >= ceil(columns / 32)]."""
    _array(name, a)
    words = -(-columns // 32)
    if a.dtype != mx.uint32 or a.shape[:-1] != rows or a.ndim != len(rows) + 1 \
            or a.shape[-1] < words:
        raise ValueError(f"{name} must be uint32 [{', '.join(map(str, rows))}, >= {words}], "
                         f"got {a.dtype} {a.shape}")


def _check_argmax_columns(columns: object, n: int) -> None:
    # The extension refuses a result type other than float32 (ValueError).
    if not isinstance(columns, Integral) or isinstance(columns, bool):
        raise TypeError(f"argmax_columns must be an int, got {columns!r}")
    if not 0 <= columns <= n:
        raise ValueError(f"argmax_columns must be in [0, N = {n}], got {columns}")


def _check_zero_point(zero_point, biases: mx.array | None, int8_activations: bool) -> None:
    if (isinstance(zero_point, bool) or not isinstance(zero_point, (int, float))
            or not math.isfinite(zero_point)):
        raise TypeError(f"zero_point must be a finite number, got {zero_point!r}")
    if biases is None and not int8_activations:
        raise ValueError("biases=None (symmetric weights, bias = -zero_point * scale) needs "
                         "int8_activations=True; pass the biases otherwise")
    if biases is not None and zero_point != 0:
        raise ValueError(f"zero_point={zero_point!r} applies only with biases=None; the "
                         "biases given already hold the offset")


def dense_matmul(x: mx.array, w: mx.array, bias: mx.array | None = None, *,
                 validate: bool = True) -> mx.array:
    """``x @ w.T`` with fp32 accumulation.

    x:    [..., K] float32/bfloat16/float16
    w:    [N, K] float32/bfloat16/float16
    bias: optional [N] float, added to every row
    Returns [..., N], accumulated in float32, in MLX's promotion of the x, w and
    bias dtypes (as nn.Linear returns: x's dtype when they agree).
    validate=False skips the Python checks (see the module docstring).
    """
    if validate:
        k = _float_input("x", x)
        _float_array("w", w)
        if w.ndim != 2 or w.shape[1] != k:
            raise ValueError(f"w must be [N, K] with x's K = {k}, got {w.shape}")
        _check_bias(bias, w.shape[0])
    return get_ops().dense_matmul(x, w, bias, stream=_CPU)


def embedding_gather(ids: mx.array, table: mx.array, scales: mx.array | None = None,
                     biases: mx.array | None = None, *, bits: int | None = None,
                     group_size: int | None = None, tiled: bool = False,
                     validate: bool = True) -> mx.array:
    """Rows ``ids`` of an embedding table.

    ids:    integer [...]
    table:  dense [V, D] float, or quantized uint32 [V, D * bits / 32] with
            scales/biases [V, D / group_size] (then bits and group_size are required)
    Returns [..., D] in the table's dtype (dense) or the scales' dtype (quantized:
    only the gathered rows are dequantized). An id outside [0, V) raises at evaluation.
    tiled: a quantized table (and its scales and biases) from ``tile_quantized``.
    validate=False skips the Python checks (see the module docstring).
    """
    if validate:
        bits, group_size = _check_embedding_gather(ids, table, scales, biases, bits, group_size)
        if not isinstance(tiled, bool) or (tiled and scales is None):
            raise ValueError(f"tiled must be a bool and applies to a quantized table only, "
                             f"got {tiled!r}")
    if scales is None:
        return get_ops().embedding_gather(ids, table, stream=_CPU)
    return get_ops().embedding_gather(ids, table, scales, biases, bits, group_size, tiled=tiled,
                                      stream=_CPU)


def _check_embedding_gather(ids, table, scales, biases, bits, group_size) -> tuple[int, int]:
    """Raises on a bad argument; returns (bits, group_size), as ints when quantized."""
    _array("ids", ids)
    if ids.dtype not in _ID_DTYPES:
        raise TypeError(f"ids must be an integer array, got {ids.dtype}")
    _array("table", table)
    if table.ndim != 2:
        raise ValueError(f"table must be 2-D, got shape {table.shape}")
    if scales is None and biases is None:
        if table.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"a dense table must be float32, bfloat16 or float16, got "
                            f"{table.dtype} (quantized tables need scales and biases)")
        return bits, group_size
    if scales is None or biases is None:
        raise ValueError("scales and biases must be given together")
    bits = _choice("bits", bits, BITS)
    group_size = _choice("group_size", group_size, GROUP_SIZES)
    if table.dtype != mx.uint32:
        raise TypeError(f"a quantized table must be uint32, got {table.dtype}")
    d = table.shape[1] * 32 // bits
    groups_shape = (table.shape[0], d // group_size)
    if d % group_size:
        raise ValueError(f"the table's row width D = {d} is not a multiple of group_size "
                         f"{group_size}")
    for name, a in (("scales", scales), ("biases", biases)):
        _float_array(name, a)
        if a.shape != groups_shape:
            raise ValueError(f"{name} must be [V, D / group_size] = {groups_shape}, "
                             f"got {a.shape}")
    if biases.dtype != scales.dtype:
        raise TypeError(f"biases dtype {biases.dtype} must equal scales dtype {scales.dtype}")
    return bits, group_size


# CPU kernels: the CPU stream, whatever MLX's default device (the GPU on a Mac).
_CPU = mx.cpu


def _array(name: str, a: object) -> None:
    if not isinstance(a, mx.array):
        raise TypeError(f"{name} must be an mx.array, got {type(a).__name__}")


def _float_array(name: str, a: object) -> None:
    _array(name, a)
    if a.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {a.dtype}")


def _float_input(name: str, x: object) -> int:
    """Validate x [..., K]; returns K."""
    _float_array(name, x)
    if x.ndim < 1:
        raise ValueError(f"{name} must be at least 1-D [..., K], got a scalar")
    return x.shape[-1]


def _check_bias(bias: object, n: int) -> None:
    if bias is None:
        return
    _float_array("bias", bias)
    if bias.shape != (n,):
        raise ValueError(f"bias must be [N] = ({n},), got {bias.shape}")


def _choice(name: str, value: object, allowed: tuple[int, ...]) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value}")
    return int(value)
