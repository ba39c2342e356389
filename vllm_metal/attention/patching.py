"""Find the attention modules of an mlx-lm model and swap in paged wrappers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.nn as nn

# Attributes every supported attention module has (Llama, Mistral, Qwen2/3 ...).
_ATTENTION_ATTRS = ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads")
_ATTENTION_NAMES = ("self_attn", "attention", "attn")


@dataclass
class AttentionSite:
    """One attention module: ``getattr(layer, attr_name) is module``."""

    layer: nn.Module
    attr_name: str
    module: nn.Module
    sliding_window: int | None


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an mlx-lm causal LM, in order."""
    layers = getattr(model, "layers", None)
    if layers is None:
        inner = getattr(model, "model", None) or getattr(model, "language_model", None)
        if inner is None:
            raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
        return decoder_layers(inner)
    return list(layers)


def find_layers(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of ``model``, one per decoder layer.

    Raises ValueError naming the layer whose attention is not a supported kind.
    """
    window = _model_sliding_window(model)
    sites = []
    for index, layer in enumerate(decoder_layers(model)):
        for name in _ATTENTION_NAMES:
            module = getattr(layer, name, None)
            if module is not None:
                break
        else:
            raise ValueError(f"decoder layer {index} ({type(layer).__name__}) has no attention module")
        missing = [a for a in _ATTENTION_ATTRS if not hasattr(module, a)]
        if missing:
            raise ValueError(
                f"attention module {type(module).__name__} of layer {index} is not supported "
                f"by vllm-metal's paged attention (missing {', '.join(missing)})")
        uses_window = bool(getattr(layer, "use_sliding", False))
        sites.append(AttentionSite(layer, name, module, window if uses_window else None))
    return sites


def walk_and_wrap(model: nn.Module,
                  make_wrapper: Callable[[nn.Module, int, int | None], nn.Module]) -> int:
    """Replace each attention module with ``make_wrapper(module, layer_index, window)``.

    Idempotent: layers already wrapped are left alone. Returns the layer count.
    """
    sites = find_layers(model) if not _already_wrapped(model) else []
    for index, site in enumerate(sites):
        setattr(site.layer, site.attr_name, make_wrapper(site.module, index, site.sliding_window))
    return len(decoder_layers(model))


def _already_wrapped(model: nn.Module) -> bool:
    from vllm_metal.attention.paged_attention import PagedAttention

    layer = decoder_layers(model)[0]
    return any(isinstance(getattr(layer, n, None), PagedAttention) for n in _ATTENTION_NAMES)


def _model_sliding_window(model: nn.Module) -> int | None:
    args = getattr(model, "args", None)
    window = getattr(args, "sliding_window", None)
    return int(window) if window else None
