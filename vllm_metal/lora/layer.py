"""LoRALinear: a decoder linear that adds the step's low-rank updates to its rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

if TYPE_CHECKING:
    from vllm_metal.lora.bank import LoRABank


def linear_features(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a dense or quantized linear, or None for any other module."""
    weight = module.get("weight") if isinstance(module, nn.Module) else None
    if not isinstance(weight, mx.array) or weight.ndim != 2:
        return None
    if isinstance(module, nn.QuantizedLinear):
        return weight.shape[1] * 32 // module.bits, weight.shape[0]
    if isinstance(module, nn.Linear):
        return weight.shape[1], weight.shape[0]
    return None


class LoRALinear(nn.Module):
    """``base(x) + delta`` where delta is each row's adapter update for this module
    (none for base requests). x [..., in] -> [..., out]; the bank holds the step's
    row-to-adapter map and the adapters' stacked weights."""

    def __init__(self, base: nn.Module, name: str, bank: LoRABank) -> None:
        super().__init__()
        self.base = base
        self.in_features, self.out_features = linear_features(base)
        self._lora_name = name
        self._lora_bank = bank

    def __call__(self, x: mx.array) -> mx.array:
        return self._lora_bank.apply(self._lora_name, x, self.base(x))

    def __getattr__(self, key: str):
        # The family's code may read the linear's own attributes (weight, bits...).
        try:
            return super().__getattr__(key)
        except AttributeError:
            return getattr(super().__getattr__("base"), key)


def wrap_linears(model: nn.Module, bank: LoRABank,
                 targets: list[str] | None = None) -> dict[str, LoRALinear]:
    """Put a LoRALinear around every linear inside the decoder layers (optionally only
    those whose last name is in TARGETS); returns them by module path."""
    found: dict[str, LoRALinear] = {}
    for path, module in list(model.named_modules()):
        if ".layers." not in f".{path}" or linear_features(module) is None:
            continue
        if isinstance(module, LoRALinear) or path.endswith(".base"):
            continue
        if targets and path.rsplit(".", 1)[-1] not in targets:
            continue
        parent_path, _, leaf = path.rpartition(".")
        parent = _module_at(model, parent_path)
        wrapped = LoRALinear(module, path, bank)
        if isinstance(parent, list):
            parent[int(leaf)] = wrapped
        else:
            setattr(parent, leaf, wrapped)
        found[path] = wrapped
    return found


def _module_at(model: nn.Module, path: str):
    node = model
    for part in path.split(".") if path else ():
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node
