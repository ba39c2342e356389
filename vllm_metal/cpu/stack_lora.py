"""StackLoRA: where the decoder stack adds LoRA updates, and the adapters it adds.

With --enable-lora every decoder linear is a LoRALinear; the stack multiplies by
its base weights and adds the adapters' updates itself (cpu::lora_cpu, the kernel
of the module path's lora_apply) right after each projection. A site is one
projection of one layer that takes adapters; a fused linear (qkv_proj,
gate_up_proj) the stack cuts into slices gives one site per slice, each reading
its block of the module's B columns (each slice shrinks x again: r x in per row,
beside the base matmul's out x in).

The bank's stacks change only when an adapter is placed or evicted, so they reach
the stack as one DecoderStackLora, rebuilt when the bank's version moves; a step
passes only its rows' slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from vllm_metal.native import get_ops

if TYPE_CHECKING:
    from vllm_metal.lora.bank import LoRABank

# The stack's projections (cpu::StackProjection).
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Site:
    layer: int
    projection: int   # index into PROJECTIONS
    module: str       # the LoRALinear's module path (the bank's key)
    b_col0: int       # first of the module's B columns this projection's output takes


@dataclass
class StackLoRA:
    bank: LoRABank
    sites: list[Site]   # ordered by (layer, projection), as the stack visits them
    _built: tuple[int, Any] | None = field(default=None, init=False)  # (bank version, set)

    def __post_init__(self) -> None:
        self.sites.sort(key=lambda s: (s.layer, s.projection))

    def step(self, weights) -> tuple[Any, mx.array] | None:
        """The step's (lora, lora_rows) for ops.decoder_stack over WEIGHTS (the
        stack's DecoderStackWeights), or None when no row has an adapter."""
        rows = self.bank.step_rows()
        if rows is None:
            return None
        if self._built is None or self._built[0] != self.bank.version:
            self._built = (self.bank.version, self._resolve(weights))
        lora = self._built[1]
        return None if lora is None else (lora, rows)

    def _resolve(self, weights):
        """A DecoderStackLora of the sites whose module holds adapters, or None."""
        modules: dict[str, int] = {}
        arrays: list[mx.array] = []
        filled: list[int] = []
        table: list[int] = []
        for site in self.sites:
            if site.module not in modules:
                stack = self.bank.stack(site.module)
                if stack is None:
                    continue
                modules[site.module] = len(modules)
                arrays += stack[:3]
                filled += [int(f) for f in stack[3]]
            table += [site.layer, site.projection, modules[site.module], site.b_col0]
        if not table:
            return None
        return get_ops().DecoderStackLora(weights, table, arrays, filled)
