"""Route an mlx-lm model's linear layers through vllm-metal's CPU kernels.

MLX's Linux CPU backend computes matmuls with a reference BLAS and scalar
quantized kernels; ``use_fast_cpu_linears`` switches every ``nn.Linear``,
``nn.QuantizedLinear``, ``nn.Embedding`` and ``nn.QuantizedEmbedding`` (and so
a tied ``as_linear`` head), and mlx-lm's expert layers (cpu/fast_experts.py), to
the extension's SIMD, multi-threaded ops. It
changes the class of each module in place: parameters, parents and any other
reference to the module stay as they are, and nothing is copied.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.cpu.fast_experts import (FAST_EXPERT_CLASSES, FastQuantizedSwitchLinear,
                                         fast_expert_class)
from vllm_metal.cpu.fast_heads import FAST_HEAD_CLASSES, fast_head_class
from vllm_metal.native import get_ops
from vllm_metal.ops.linear import (BITS, GROUP_SIZES, dense_matmul, embedding_gather,
                                   quantized_matmul, tile_quantized, untile_quantized)

_FLOATS = (mx.float32, mx.bfloat16, mx.float16)

# The modules call vllm_metal.ops.linear with validate=False: their parameters
# are checked once when switched (_quantized_ok / _dense_ok), the extension
# checks x itself, and a decode step makes ~200 of these calls.


class FastLinear(nn.Linear):
    """nn.Linear through ``dense_matmul``: x [..., K] -> [..., N]."""

    def __call__(self, x: mx.array) -> mx.array:
        return dense_matmul(x, self["weight"], self.get("bias"), validate=False)


class FastQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear (affine) through ``quantized_matmul``: x [..., K] -> [..., N]."""

    int8_activations: bool = False  # see use_fast_cpu_linears
    zero_point: int | None = None   # see _find_zero_point
    tiled: bool = False             # see tile_int8_weights

    def __call__(self, x: mx.array) -> mx.array:
        return _quantized_product(self, x, self.get("bias"))

    def greedy(self, x: mx.array, columns: int, allowed: mx.array | None = None) -> mx.array:
        """int32 [...]: argmax over the first ``columns`` of ``self(x)`` (float32 x), of
        the columns ALLOWED admits (a grammar bitmask, uint32 [..., ceil(columns / 32)])."""
        return _quantized_product(self, x, self.get("bias"), argmax_columns=columns,
                                  allowed=allowed)


class FastEmbedding(nn.Embedding):
    """nn.Embedding through ``embedding_gather``; ``as_linear`` through ``dense_matmul``."""

    activation_dtype: mx.Dtype | None = None  # see use_fast_cpu_linears

    def __call__(self, ids: mx.array) -> mx.array:
        return _as_activation(self, embedding_gather(ids, self["weight"], validate=False))

    def as_linear(self, x: mx.array) -> mx.array:
        return dense_matmul(x, self["weight"], validate=False)


class FastQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding through ``embedding_gather`` (only the gathered rows
    are dequantized); ``as_linear`` through ``quantized_matmul``."""

    activation_dtype: mx.Dtype | None = None  # see use_fast_cpu_linears
    int8_activations: bool = False
    zero_point: int | None = None
    tiled: bool = False

    def __call__(self, ids: mx.array) -> mx.array:
        rows = embedding_gather(ids, self["weight"], self["scales"], self["biases"],
                                bits=self.bits, group_size=self.group_size, tiled=self.tiled,
                                validate=False)
        return _as_activation(self, rows)

    def as_linear(self, x: mx.array) -> mx.array:
        return _quantized_product(self, x)

    def greedy(self, x: mx.array, columns: int, allowed: mx.array | None = None) -> mx.array:
        """int32 [...]: argmax over the first ``columns`` of ``as_linear(x)`` (float32 x),
        of the columns ALLOWED admits (as FastQuantizedLinear.greedy)."""
        return _quantized_product(self, x, argmax_columns=columns, allowed=allowed)


def use_fast_cpu_linears(model: nn.Module, activation_dtype: mx.Dtype | None = None,
                         int8_activations: bool = False) -> int:
    """Switch the supported linear and embedding modules of ``model`` to the CPU ops.

    Returns how many modules were switched. Modules the kernels do not cover
    (other quantization modes or bit widths, integer weights) keep MLX's
    implementation. Idempotent.

    ``activation_dtype`` (e.g. mx.float32) makes the token embeddings return that
    dtype, so bf16/fp16 weights compute on fp32 activations: the ops follow MLX's
    type promotion, so the activations then stay fp32 through the network.

    ``int8_activations`` makes the quantized layers (and a quantized tied head, and
    affine-quantized experts) round their input to int8 per 32 columns
    (csrc/cpu/linear/linear_q8.h).
    """
    get_ops()  # fail here, not in the first forward, if the extension is missing
    switched = 0
    for _, module in model.named_modules():
        fast = _fast_class(module)
        if fast is not None:
            module.__class__ = fast
            switched += 1
        if isinstance(module, (FastEmbedding, FastQuantizedEmbedding)):
            module.activation_dtype = activation_dtype
        if isinstance(module, _TILED_CLASSES) and module.tiled and not int8_activations:
            _set_layout(module, tiled=False)
        if isinstance(module, (FastQuantizedLinear, FastQuantizedEmbedding)):
            module.int8_activations = int8_activations
            module.zero_point = None
            if int8_activations:
                _narrow_scales(module)
                _find_zero_point(module)
        if isinstance(module, FastQuantizedSwitchLinear):
            module.int8_activations = int8_activations and module.mode == "affine"
    return switched


def int8_capable(model: nn.Module) -> bool:
    """Whether ``model`` has layers int8 activations would take (quantized linears,
    embeddings and affine experts the CPU ops run), switched or not yet."""
    for _, module in model.named_modules():
        kind = type(module) if isinstance(module, _FAST_CLASSES) else _fast_class(module)
        if kind in (FastQuantizedLinear, FastQuantizedEmbedding):
            return True
        if kind is FastQuantizedSwitchLinear and module.mode == "affine":
            return True
    return False


def runs_int8(model: nn.Module) -> bool:
    """Whether some layer of ``model`` rounds its input to int8 (use_fast_cpu_linears)."""
    return any(getattr(m, "int8_activations", False) for _, m in model.named_modules())


def tile_int8_weights(model: nn.Module) -> int:
    """Store the weights of ``model``'s int8-activation quantized layers in the int8
    kernels' tile order (ops.linear.tile_quantized), in place; returns how many.

    With them one kernel serves a row of x alone or among others (decode is as fast
    as the one-row kernel this replaces and a few rows faster), so a request's
    tokens do not depend on its batch. Call it once every module that copies
    weights out of these layers has done so (LatentAttention cuts its projections
    from kv_b_proj's rows in MLX's layout): afterwards only the layers' own calls,
    the decoder stack and ops that take ``tiled`` read them. Idempotent."""
    tiled = 0
    for _, module in model.named_modules():
        if (isinstance(module, _TILED_CLASSES) and module.int8_activations
                and not module.tiled):
            _set_layout(module, tiled=True)
            tiled += 1
    return tiled


_TILED_CLASSES = (FastQuantizedLinear, FastQuantizedEmbedding, FastQuantizedSwitchLinear)


def _set_layout(module: nn.Module, tiled: bool) -> None:
    """The module's quantized arrays rewritten in tile order (tiled) or MLX's, and
    evaluated, so the other layout's copies are freed now."""
    names = [n for n in ("weight", "scales", "biases") if n in module]
    change = tile_quantized if tiled else untile_quantized
    for name, array in zip(names, change(*(module[n] for n in names))):
        module[name] = array
    mx.eval([module[n] for n in names])
    module.tiled = tiled


def count_fast_modules(model: nn.Module) -> int:
    """How many of ``model``'s modules run on the CPU ops."""
    return sum(type(m) in _FAST_CLASSES for _, m in model.named_modules())


def _narrow_scales(module: nn.Module) -> None:
    """fp32 scales and biases to fp16 when that is exact (GGUF's Q4_1/Q8_0 steps
    are fp16 to begin with): a 4-bit decode step reads a sixth fewer bytes.
    Only with int8 activations, whose kernels read fp16 scales at no cost."""
    scales, biases = module["scales"], module["biases"]
    if scales.dtype != mx.float32:
        return
    s16, b16 = scales.astype(mx.float16), biases.astype(mx.float16)
    if (mx.array_equal(s16.astype(mx.float32), scales).item()
            and mx.array_equal(b16.astype(mx.float32), biases).item()):
        module["scales"], module["biases"] = s16, b16


def _find_zero_point(module: nn.Module) -> None:
    """Mark symmetric weights, biases == -2^(bits-1) * scales (GGUF's Q8_0 and Q4_0):
    the int8 kernels then form each bias from its scale instead of reading it, and a
    GGUF model's Q8_0 head reads 1/18 fewer bytes per token. The biases stay for the
    embedding gather and the decoder stack's fp32 probe; the int8 stack takes the
    zero point from here (decoder_stack._Rows) and is handed no biases."""
    zero = 2 ** (module.bits - 1)
    symmetric = mx.array_equal(module["biases"], module["scales"] * -zero).item()
    module.zero_point = zero if symmetric else None


def _biases(module: nn.Module) -> mx.array | None:
    # With int8 off for a while (the decoder stack's fp32 probe), the biases serve.
    symmetric = module.zero_point is not None and module.int8_activations
    return None if symmetric else module["biases"]


def _quantized_product(module: nn.Module, x: mx.array, bias: mx.array | None = None,
                       argmax_columns: int = 0, allowed: mx.array | None = None) -> mx.array:
    """x [..., K] @ W.T of a switched quantized module (+ bias) -> [..., N]; with
    argmax_columns > 0, each row's argmax over that many columns instead (int32 [...]),
    of those ALLOWED admits when given (ops.quantized_matmul's argmax_allowed)."""
    biases = _biases(module)
    return quantized_matmul(x, module["weight"], module["scales"], biases,
                            bits=module.bits, group_size=module.group_size, bias=bias,
                            int8_activations=module.int8_activations,
                            zero_point=module.zero_point if biases is None else 0,
                            argmax_columns=argmax_columns, argmax_allowed=allowed,
                            tiled=module.tiled, validate=False)


def _as_activation(module: nn.Module, rows: mx.array) -> mx.array:
    dtype = module.activation_dtype
    return rows if dtype is None or rows.dtype == dtype else rows.astype(dtype)


def _fast_class(module: nn.Module) -> type | None:
    # Exact types only: a subclass may have changed what __call__ computes.
    kind = type(module)
    experts = fast_expert_class(module) or fast_head_class(module)
    if experts is not None:
        return experts
    if kind is nn.Linear and _dense_ok(module):
        return FastLinear
    if kind is nn.Embedding and _dense_ok(module):
        return FastEmbedding
    if kind is nn.QuantizedLinear and _quantized_ok(module):
        return FastQuantizedLinear
    if kind is nn.QuantizedEmbedding and _quantized_ok(module):
        return FastQuantizedEmbedding
    return None


_FAST_CLASSES = (FastLinear, FastEmbedding, FastQuantizedLinear, FastQuantizedEmbedding,
                 *FAST_EXPERT_CLASSES, *FAST_HEAD_CLASSES)


def _dense_ok(module: nn.Module) -> bool:
    bias = module.get("bias")
    return (module["weight"].ndim == 2 and module["weight"].dtype in _FLOATS
            and (bias is None or bias.dtype in _FLOATS))


def _quantized_ok(module: nn.Module) -> bool:
    scales, biases, bias = module["scales"], module.get("biases"), module.get("bias")
    return (getattr(module, "mode", "affine") == "affine"
            and module.bits in BITS and module.group_size in GROUP_SIZES
            and biases is not None and module["weight"].dtype == mx.uint32
            and scales.dtype in _FLOATS and biases.dtype == scales.dtype
            and (bias is None or bias.dtype in _FLOATS))
