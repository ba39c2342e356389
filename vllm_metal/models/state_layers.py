"""The state layers of a hybrid model (Gated DeltaNet, Mamba2 or short convolutions), as the
paged runner drives them: the conv modules of each, which continue from the pages
(attention/state_cache.py)."""

from __future__ import annotations

import mlx.nn as nn

from vllm_metal.attention.state_cache import PagedShortConv


def wrap_state_convs(layers: list | None, state_entries: list[int], family: str,
                     error: type[Exception]) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Give each state entry's layer PagedShortConvs in place of its mixer's depthwise
    ``Conv1d`` modules (idempotent), numbered in module order; returns per entry
    (kernel taps, channels of each conv). mlx-lm makes the caches in layer order and
    only state layers hold convs, so the n-th state entry is the n-th layer with a
    conv (entry i is layer i where every layer has a cache; nemotron_h's MLP layers
    have none). A layer with no conv, or convs of different kernels, has a mixer this
    platform does not page: refused with ``error``."""
    convs: dict[int, tuple[int, tuple[int, ...]]] = {}
    if not state_entries:
        return convs
    if layers is None:
        raise error(f"{family}: its recurrent-state layers are not listed under .layers")
    with_convs = [(i, layer) for i, layer in enumerate(layers) if _convs_of(layer)]
    if len(with_convs) != len(state_entries):
        raise error(
            f"{family}: mlx-lm keeps a recurrent state (ArraysCache) for "
            f"{len(state_entries)} layer(s) but {len(with_convs)} layer(s) hold convolutions; "
            "vllm-metal pages mixers that start with short convolutions (Gated DeltaNet, "
            "Mamba2) only")
    for entry, (index, layer) in zip(state_entries, with_convs):
        found = _convs_of(layer)
        modules = [m.conv if isinstance(m, PagedShortConv) else m for _, _, m in found]
        weights = [m.weight for m in modules]
        taps = {int(w.shape[1]) for w in weights}
        # PagedShortConv computes a plain causal depthwise conv: one input per row,
        # the state's K - 1 before it, stride 1, no dilation, no padding of its own.
        plain = all(w.shape[2] == 1 and m.groups == w.shape[0] and m.stride == 1
                    and m.dilation == 1 and m.padding == 0 for m, w in zip(modules, weights))
        if len(taps) != 1 or not plain:
            kind = type(layer)
            raise error(
                f"{family}: layer {index} ({kind.__module__}.{kind.__qualname__}) "
                "keeps a recurrent state (mlx-lm's ArraysCache) but not through depthwise "
                "convolutions of one kernel size; vllm-metal pages Gated DeltaNet and Mamba2 "
                "mixers (short convs, then the gated rule) only")
        for n, (owner, name, module) in enumerate(found):
            if isinstance(module, nn.Conv1d):
                setattr(owner, name, PagedShortConv(entry, n, module))
        convs[entry] = (taps.pop(), tuple(int(w.shape[0]) for w in weights))
    return convs


def _convs_of(layer: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(owner, attribute, module) of the layer's Conv1d / PagedShortConv modules, in
    module order."""
    return [(owner, name, module)
            for _, owner in sorted(layer.named_modules(), key=lambda m: m[0])
            for name, module in sorted(owner.children().items())
            if isinstance(module, (nn.Conv1d, PagedShortConv))
            and not isinstance(owner, PagedShortConv)]
