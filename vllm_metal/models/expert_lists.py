"""Mixture-of-experts blocks that hold one MLP module per expert and run them token by
token in Python (mlx-lm's DBRX: a ``.tolist()`` of the routing, then a loop over rows,
each a host sync and a small matmul per expert), restacked once at load into
mlx-lm's ``SwitchGLU`` so a step runs every pair through one expert matmul (MLX's
``gather_mm`` / ``gather_qmm`` on Metal, ops.experts' on the CPU).

The block's routing (router logits, fp32 softmax, top-k, renormalised by the L1 norm)
is recomputed here and the swap kept only if the restacked block reproduces the
original on a probe input; otherwise the family's own block runs.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchGLU

# The per-expert MLP's (gate, up, down) attribute names, by block class name.
_EXPERT_PARTS = {"SparseMoeBlock": ("w1", "v1", "w2")}
_PROBE_ROWS = 5
_PROBE_RTOL = 1e-4


class StackedExperts(nn.Module):
    """A restacked DBRX-style block: x [..., hidden] -> [..., hidden]."""

    def __init__(self, router: nn.Module, switch_mlp: SwitchGLU, top_k: int) -> None:
        super().__init__()
        self.router = router
        self.switch_mlp = switch_mlp
        self.num_experts_per_tok = top_k

    def __call__(self, x: mx.array) -> mx.array:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        gates = mx.softmax(self.router(x).astype(mx.float32), axis=-1)
        k = self.num_experts_per_tok
        inds = mx.stop_gradient(mx.argpartition(-gates, kth=k - 1, axis=-1)[:, :k])
        scores = mx.take_along_axis(gates, inds, axis=-1)
        scores = (scores / scores.sum(axis=-1, keepdims=True)).astype(x.dtype)
        y = self.switch_mlp(x, inds)  # [rows, k, hidden]
        return (y * scores[..., None]).sum(axis=-2).reshape(shape)


def restack_expert_lists(layers: list[nn.Module]) -> int:
    """Swap each layer's per-expert-list MoE block for a StackedExperts that reproduces
    it; returns how many were swapped."""
    swapped = 0
    for layer in layers:
        for name, block in list(layer.children().items()):
            if not isinstance(block, nn.Module):
                continue
            stacked = _restacked(block)
            if stacked is not None:
                setattr(layer, name, stacked)
                swapped += 1
    return swapped


def _restacked(block: nn.Module) -> StackedExperts | None:
    parts = _EXPERT_PARTS.get(type(block).__name__)
    experts = getattr(block, "experts", None)
    router = getattr(block, "router", None)
    top_k = getattr(block, "num_experts_per_tok", None)
    if parts is None or not isinstance(experts, list) or not experts or router is None \
            or not isinstance(top_k, int):
        return None
    projections = []
    for part in parts:
        stacked = _stack([getattr(e, part, None) for e in experts])
        if stacked is None:
            return None
        projections.append(stacked)
    # A 1 x 1 SwitchGLU (its own random init would be the experts' full size), given
    # the stacked projections.
    switch = SwitchGLU(1, 1, len(experts), bias=False)
    (switch.gate_proj, hidden), (switch.up_proj, _), (switch.down_proj, _) = projections
    candidate = StackedExperts(router, switch, top_k)
    x = mx.random.normal((_PROBE_ROWS, hidden), key=mx.random.key(7))
    x = x.astype(_dtype(experts[0]))
    want, got = block(x).astype(mx.float32), candidate(x).astype(mx.float32)
    scale = max(float(mx.abs(want).max()), 1e-6)
    if float(mx.abs(got - want).max()) > _PROBE_RTOL * scale:
        return None
    return candidate


def _stack(layers: list) -> tuple[nn.Module, int] | None:
    """(one SwitchLinear / QuantizedSwitchLinear holding the experts' linears [E, N, K],
    K), or None when they are not alike (kind, shape, quantization) or carry a bias."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    first = layers[0]
    # isinstance: a backend may have switched the linears to its own subclasses,
    # which compute the same products.
    if any(type(m) is not type(first) or "bias" in m for m in layers) \
            or not isinstance(first, (nn.Linear, nn.QuantizedLinear)):
        return None
    quantized = isinstance(first, nn.QuantizedLinear)
    if quantized and any((m.bits, m.group_size, m.mode) != (first.bits, first.group_size,
                                                             first.mode) for m in layers):
        return None
    if any(m["weight"].shape != first["weight"].shape for m in layers):
        return None
    experts = len(layers)
    # Built at the smallest size, then given the stacked arrays.
    if not quantized:
        stacked = SwitchLinear(1, 1, experts, bias=False)
        stacked.weight = mx.stack([m["weight"] for m in layers])
        return stacked, stacked.weight.shape[-1]
    stacked = QuantizedSwitchLinear(first.group_size, 1, experts, bias=False,
                                    group_size=first.group_size, bits=first.bits,
                                    mode=first.mode)
    stacked.weight = mx.stack([m["weight"] for m in layers])
    stacked.scales = mx.stack([m["scales"] for m in layers])
    if first.get("biases") is not None:
        stacked.biases = mx.stack([m["biases"] for m in layers])
    elif "biases" in stacked:
        del stacked["biases"]
    return stacked, stacked.weight.shape[-1] * 32 // first.bits


def _dtype(module: nn.Module) -> mx.Dtype:
    from mlx.utils import tree_flatten

    for _, p in tree_flatten(module.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32
