"""LayerCache: what an mlx-lm model holds as one layer's KV cache in a paged forward.

mlx-lm attention touches its cache at one narrow point: it rotates with
``cache.offset``, stores with ``cache.update_and_fetch(keys, values)`` and
hands the result to ``base.scaled_dot_product_attention(..., cache=cache,
mask=mask)``, whose mask came from ``cache.make_mask(..., window_size=W)``.
LayerCache answers those calls against vLLM's paged cache, so each family's
own module code (fused projections, q/k norms of any shape, partial or
per-layer RoPE, scale overrides, sinks) runs unmodified.

The runner feeds the packed step as ``total_q`` rows of one token (input ids
[total_q, 1]): mlx-lm handles that as a batch whose offset is an array, one
position per row, and only attention mixes rows, here through the block tables.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from vllm_metal.attention.context import get_forward_context, in_forward


@dataclass(frozen=True)
class PagedMask:
    """The mask a LayerCache makes: only the window the layer asked for
    (None: full causal attention); the block tables say the rest."""

    window: int | None


class LayerCache:
    """KV entry ``entry`` of the model (entries are the caches mlx-lm would make:
    one per layer, fewer where layers share K/V)."""

    def __init__(self, entry: int) -> None:
        self.entry = entry

    @property
    def offset(self) -> mx.array:
        """int32 [total_q]: each row's position (mlx-lm's per-row cache offset)."""
        return get_forward_context().metadata.positions

    def make_mask(self, N: int, *, return_array: bool = False,  # noqa: N803 (mlx-lm's name)
                  window_size: int | None = None, **_: Any) -> PagedMask:
        return PagedMask(int(window_size) if window_size else None)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """keys, values [total_q, kv_heads, 1, D]: written to the paged cache and
        returned as they are; paged_sdpa reads the history from the cache."""
        get_forward_context().write(self.entry, keys, values)
        return keys, values


def paged_sdpa(queries: mx.array, keys: mx.array, values: mx.array, cache: Any,
               scale: float, mask: Any, sinks: mx.array | None = None) -> mx.array:
    """mlx-lm's ``scaled_dot_product_attention``, paged when the keys are a LayerCache's.

    A layer without a cache of its own (Gemma 4's KV-shared layers) is recognised
    by the keys another layer's cache returned. Anything else is not ours and goes
    to mlx-lm's function unchanged.
    """
    entry = cache.entry if isinstance(cache, LayerCache) else None
    if entry is None and in_forward():
        entry = get_forward_context().entry_of(keys)
    if entry is None:
        return _MLX_SDPA(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    return get_forward_context().attend(entry, queries, float(scale), mask_window(mask, entry),
                                        sinks=sinks)


def mask_window(mask: Any, entry: int) -> int | None:
    """The sliding window a layer's mask stands for; a mask array of the family's
    own making cannot be honoured by the paged kernels."""
    if isinstance(mask, PagedMask):
        return mask.window
    if mask is None or (isinstance(mask, str) and mask == "causal"):
        return None
    raise ValueError(
        f"KV entry {entry}: the layer attends with a mask of its own "
        f"({type(mask).__name__}), not one its cache made; the paged kernels take "
        "only causal and sliding-window masks")


def _mlx_sdpa():
    from mlx_lm.models import base

    return base.scaled_dot_product_attention


_MLX_SDPA = _mlx_sdpa()


def rebind_in_mlx_lm(name: str, original: Any, replacement: Any) -> int:
    """Point ``name`` at ``replacement`` in every imported mlx-lm model module where it
    is ``original`` (families bind mlx-lm's helpers at import). Idempotent; returns
    how many modules were switched by this call."""
    switched = 0
    for module_name, module in list(sys.modules.items()):
        if (module_name.startswith("mlx_lm.models.") and module is not None
                and getattr(module, name, None) is original):
            setattr(module, name, replacement)
            switched += 1
    return switched


def install_paged_sdpa() -> int:
    """mlx-lm's ``scaled_dot_product_attention`` -> paged_sdpa (rebind_in_mlx_lm)."""
    return rebind_in_mlx_lm("scaled_dot_product_attention", _MLX_SDPA, paged_sdpa)
