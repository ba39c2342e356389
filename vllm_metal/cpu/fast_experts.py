"""mlx-lm's expert layers (``SwitchLinear``, ``QuantizedSwitchLinear``) through
vllm-metal's expert matmul.

MLX's CPU ``gather_qmm`` / ``gather_mm`` are scalar and single-threaded and
read every expert a pair names once per pair; ``ops.experts.expert_matmul``
groups the pairs by expert and runs each touched expert through the SIMD
linear kernels on the pool. The routing (scores, top-k, normalisation, shared
experts) stays the family's own code: only the products change.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from vllm_metal.ops.experts import expert_matmul
from vllm_metal.ops.linear import BITS, GROUP_SIZES, untile_quantized

_FLOATS = (mx.float32, mx.bfloat16, mx.float16)


class FastSwitchLinear(SwitchLinear):
    """SwitchLinear: x [..., 1, K] with indices [...] -> [..., 1, N] (gather_mm's shapes)."""

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        rows = _pair_rows(x, indices)
        if rows is None:
            return super().__call__(x, indices, sorted_indices)
        out = expert_matmul(rows, indices.reshape(-1), self["weight"], bias=self.get("bias"))
        return out.reshape(*indices.shape, 1, out.shape[-1])


class FastQuantizedSwitchLinear(QuantizedSwitchLinear):
    """QuantizedSwitchLinear (affine or MXFP4): shapes as FastSwitchLinear."""

    int8_activations: bool = False  # affine only; see fast_linears.use_fast_cpu_linears
    tiled: bool = False             # see fast_linears.tile_int8_weights

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        rows = _pair_rows(x, indices)
        if rows is None:
            return self._mlx(x, indices, sorted_indices)
        out = expert_matmul(rows, indices.reshape(-1), self["weight"], self["scales"],
                            self.get("biases"), bits=self.bits, group_size=self.group_size,
                            bias=self.get("bias"), mode=self.mode,
                            int8_activations=self.int8_activations, tiled=self.tiled)
        return out.reshape(*indices.shape, 1, out.shape[-1])

    def _mlx(self, x: mx.array, indices: mx.array, sorted_indices: bool) -> mx.array:
        """MLX's own op, for shapes the expert matmul does not take (on MLX's layout: a
        tiled stack is untiled for the call)."""
        if not self.tiled:
            return super().__call__(x, indices, sorted_indices)
        names = [n for n in ("weight", "scales", "biases") if n in self]
        tiled = {n: self[n] for n in names}
        try:
            for n, a in zip(names, untile_quantized(*tiled.values())):
                self[n] = a
            return super().__call__(x, indices, sorted_indices)
        finally:
            for n, a in tiled.items():
                self[n] = a


FAST_EXPERT_CLASSES = (FastSwitchLinear, FastQuantizedSwitchLinear)


def fast_expert_class(module: nn.Module) -> type | None:
    """The fast class for an expert layer the op covers, else None (exact types
    only: a subclass may compute something else)."""
    kind = type(module)
    bias = module.get("bias") if kind in (SwitchLinear, QuantizedSwitchLinear) else None
    if bias is not None and (bias.ndim != 2 or bias.dtype not in _FLOATS):
        return None
    if kind is SwitchLinear:
        w = module["weight"]
        return FastSwitchLinear if w.ndim == 3 and w.dtype in _FLOATS else None
    if kind is QuantizedSwitchLinear:
        return FastQuantizedSwitchLinear if quantized_stack_ok(module) else None
    return None


def quantized_stack_ok(module: nn.Module) -> bool:
    """A quantized [E, N, K] stack the expert matmul reads: MLX affine at the linear
    kernels' bits and group sizes, or MXFP4."""
    scales, biases = module["scales"], module.get("biases")
    codes = (module["weight"].dtype == mx.uint32 and module["weight"].ndim == 3
             and getattr(module, "global_scale", None) is None)
    affine = (module.mode == "affine" and module.bits in BITS
              and module.group_size in GROUP_SIZES and biases is not None
              and scales.dtype in _FLOATS and biases.dtype == scales.dtype)
    mxfp4 = (module.mode == "mxfp4" and module.bits == 4 and module.group_size == 32
             and biases is None and scales.dtype == mx.uint8)
    return codes and (affine or mxfp4)


def _pair_rows(x: mx.array, indices: mx.array) -> mx.array | None:
    """x as the op's rows [R, K] when its shape is one mlx-lm's expert layers pass
    (x [*I, 1, K]: a row per pair; x [*I[:-1], 1, 1, K]: a token's row shared by its
    experts), else None (MLX's own op then runs)."""
    batch, lead = tuple(x.shape[:-2]), tuple(indices.shape)
    if x.ndim < 2 or x.shape[-2] != 1 or not lead or x.dtype not in _FLOATS:
        return None
    if batch != lead and batch != lead[:-1] + (1,):
        return None
    return x.reshape(-1, x.shape[-1])
