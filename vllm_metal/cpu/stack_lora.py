"""StackLoRA: where the decoder stack adds LoRA updates, and each step's updates.

With --enable-lora every decoder linear is a LoRALinear; the stack multiplies by
its base weights and adds the adapters' updates itself (cpu::lora_cpu, the kernel
of the module path's lora_apply) right after each projection. A site is one
projection of one layer that takes adapters; a fused linear (qkv_proj,
gate_up_proj) the stack cuts into slices gives one site per slice, each reading
its block of the module's B rows (each slice shrinks x again: r x in per row,
beside the base matmul's out x in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

if TYPE_CHECKING:
    from vllm_metal.lora.bank import LoRABank

# The stack's projections (cpu::StackProjection).
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Site:
    layer: int
    projection: int   # index into PROJECTIONS
    module: str       # the LoRALinear's module path (the bank's key)
    b_row0: int       # first of the module's B rows this projection's output takes


@dataclass
class StackLoRA:
    bank: LoRABank
    sites: list[Site]   # ordered by (layer, projection), as the stack visits them
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.sites.sort(key=lambda s: (s.layer, s.projection))
        self.names = list(dict.fromkeys(s.module for s in self.sites))

    def step(self) -> tuple[list[int], list[mx.array]]:
        """The step's (lora_table, lora_arrays) for ops.decoder_stack: one entry
        (layer, projection, b_row0) and four arrays (rows, a, b, scale) per site whose
        module a row's adapter targets; both empty when none does."""
        updates = self.bank.step_updates(self.names)
        table: list[int] = []
        arrays: list[mx.array] = []
        if not updates:
            return table, arrays
        for site in self.sites:
            found = updates.get(site.module)
            if found is not None:
                table += [site.layer, site.projection, site.b_row0]
                arrays += found
        return table, arrays
