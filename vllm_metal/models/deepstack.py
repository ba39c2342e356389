"""Deepstack: visual rows added to an image's hidden states inside the language model.

Qwen3-VL's vision tower hands the language model, besides the rows that replace
an image's placeholder embeddings, one more set of rows per "deepstack level"
(mergers over earlier ViT blocks); level i is added to the image's rows of the
residual stream after decoder layer i. mlx-lm's text model knows nothing of it:
``use_deepstack`` wraps the first layers so that each adds its level of the
forward's ``ForwardContext.deepstack`` (set by packed_forward from the step's
merged encoder outputs; None in a step without images).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import get_forward_context, in_forward


class DeepstackLayer(nn.Module):
    """A decoder layer followed by the addition of its deepstack level."""

    def __init__(self, layer: nn.Module, level: int) -> None:
        super().__init__()
        self.layer = layer
        self.level = level

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        """x [total_q, 1, hidden] (the packed step's rows) -> the layer's output, with
        level ``level`` added at the step's image rows."""
        out = self.layer(x, *args, **kwargs)
        given = get_forward_context().deepstack if in_forward() else None
        if given is None:
            return out
        rows, levels = given
        flat = out.reshape(-1, out.shape[-1])
        flat = flat.at[rows].add(levels[self.level].astype(out.dtype))
        return flat.reshape(out.shape)

    def __getattr__(self, name: str):
        # The wrapped layer's attributes (self_attn, mlp, ...) stay reachable.
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "layer" not in self:
                raise
            return getattr(self["layer"], name)


def use_deepstack(layers: list[nn.Module], levels: int) -> None:
    """Wrap ``layers[:levels]`` (the text model's decoder layers, in place); a layer
    another pipeline stage runs is wrapped there (each rank gathers the rows)."""
    from vllm_metal.distributed.pipeline import runs_elsewhere

    if levels > len(layers):
        raise ValueError(f"{levels} deepstack levels for a model of {len(layers)} layers")
    for i in range(levels):
        if not isinstance(layers[i], DeepstackLayer) and not runs_elsewhere(layers[i]):
            layers[i] = DeepstackLayer(layers[i], i)
