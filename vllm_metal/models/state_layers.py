"""The linear-attention (Gated DeltaNet) layers of a hybrid model, as the paged
runner drives them: which KV entries keep a state instead of K/V, and the conv
module of each that continues from the pages (attention/state_cache.py)."""

from __future__ import annotations

import mlx.nn as nn

from vllm_metal.attention.state_cache import PagedShortConv


def wrap_state_convs(layers: list | None, state_entries: list[int], family: str,
                     error: type[Exception]) -> None:
    """Give each state entry's layer a PagedShortConv in place of its mixer's
    depthwise ``conv1d`` (idempotent). mlx-lm makes one cache per layer for these
    families, so entry i is layer i. A layer with no such conv, or with several, has
    a mixer this platform does not page: refused with ``error``, naming it."""
    if not state_entries:
        return
    if layers is None:
        raise error(f"{family}: its recurrent-state layers are not listed under .layers")
    for entry in state_entries:
        found = [(owner, name, module) for owner in layers[entry].modules()
                 for name, module in owner.children().items()
                 if isinstance(module, (nn.Conv1d, PagedShortConv))]
        if len(found) != 1:
            layer = type(layers[entry])
            raise error(
                f"{family}: layer {entry} ({layer.__module__}.{layer.__qualname__}) keeps a "
                f"recurrent state (mlx-lm's ArraysCache) with {len(found)} convolutions; "
                "vllm-metal pages Gated DeltaNet mixers (one depthwise conv, then the "
                "gated delta rule) only")
        owner, name, module = found[0]
        if isinstance(module, nn.Conv1d):
            setattr(owner, name, PagedShortConv(entry, module))
