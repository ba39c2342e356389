"""LoRABank: the adapters resident for the forward, and each step's row -> adapter map.

--max-loras slots. A slot holds one adapter; for every module an adapter targets,
the module's stack holds A [L, r_max, in] and B [L, r_max, out] (ranks padded with
zeros to --max-lora-rank) and scale [L]. A step's rows name their adapter by slot
(-1: the base model), so one batch mixes adapters and base requests, and a module
no row's adapter targets costs nothing. The update itself is one op per module
(vllm_metal.ops.lora), which groups the rows by slot; the CPU decoder stack holds the
stacks itself between adapter loads (``version`` says when they changed) and takes
each step's row slots (``step_rows``), running the same kernel inside its node.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from vllm_metal.lora.adapter_files import ModuleUpdate
from vllm_metal.ops.lora import lora_apply, lora_delta, takes_dtypes


@dataclass
class _Stack:
    a: mx.array       # [L, r_max, in]
    b: mx.array       # [L, r_max, out]
    scale: mx.array   # float32 [L]
    filled: np.ndarray  # bool [L]: the slot's adapter targets this module


class LoRABank:
    def __init__(self, num_slots: int, max_rank: int, dtype: mx.Dtype) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.dtype = dtype
        self._stacks: dict[str, _Stack] = {}
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, LRU first
        self._rows: np.ndarray | None = None   # int32 [T]: slot per row, -1 base
        self._module_rows: dict[bytes, mx.array | None] = {}
        self._step_rows: mx.array | None = None
        self.version = 0   # bumped whenever a stack's contents change

    # -- slots ---------------------------------------------------------------

    def resident(self) -> set[int]:
        return set(self._slot_of)

    def evict(self, adapter_id: int) -> None:
        slot = self._slot_of.pop(adapter_id, None)
        if slot is not None:
            self._clear(slot)

    def prepare_step(self, row_adapters: np.ndarray,
                     load: Callable[[int], dict[str, ModuleUpdate]]) -> None:
        """ROW_ADAPTERS int [T] (0: base) -> the step's row slots. Adapters not resident
        are placed with LOAD(adapter_id) -> {module: ModuleUpdate}, into free slots or
        those of adapters this step does not use (least recently used first)."""
        wanted = [int(i) for i in np.unique(row_adapters) if i != 0]
        self._module_rows.clear()
        self._step_rows = None
        if not wanted:
            self._rows = None
            return
        if len(wanted) > self.num_slots:
            raise RuntimeError(f"a step uses {len(wanted)} adapters but --max-loras is "
                               f"{self.num_slots}")  # vLLM's scheduler never does this
        for adapter_id in wanted:
            if adapter_id in self._slot_of:
                self._slot_of.move_to_end(adapter_id)
        for adapter_id in wanted:
            if adapter_id not in self._slot_of:
                self._place(adapter_id, load(adapter_id), keep=set(wanted))
        lut = np.full(max(wanted) + 1, -1, dtype=np.int32)
        for adapter_id in wanted:
            lut[adapter_id] = self._slot_of[adapter_id]
        self._rows = lut[np.asarray(row_adapters, dtype=np.int64)]

    def _place(self, adapter_id: int, updates: dict[str, ModuleUpdate], keep: set[int]) -> None:
        used = set(self._slot_of.values())
        free = [s for s in range(self.num_slots) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(a for a in self._slot_of if a not in keep)
            slot = self._slot_of.pop(victim)
            self._clear(slot)
        for name, update in updates.items():
            self._write(name, slot, update)
        self._slot_of[adapter_id] = slot

    def _write(self, name: str, slot: int, update: ModuleUpdate) -> None:
        stack = self._stacks.get(name)
        out, rank = update.b.shape
        inp = update.a.shape[1]
        if stack is None:
            stack = _Stack(mx.zeros((self.num_slots, self.max_rank, inp), self.dtype),
                           mx.zeros((self.num_slots, self.max_rank, out), self.dtype),
                           mx.zeros((self.num_slots,), mx.float32),
                           np.zeros(self.num_slots, dtype=bool))
            self._stacks[name] = stack
        a = mx.zeros((self.max_rank, inp), self.dtype)
        a[:rank] = update.a.astype(self.dtype)
        b = mx.zeros((self.max_rank, out), self.dtype)
        b[:rank] = update.b.T.astype(self.dtype)
        stack.a[slot] = a
        stack.b[slot] = b
        stack.scale[slot] = update.scale
        stack.filled[slot] = True
        mx.eval(stack.a, stack.b, stack.scale)
        self.version += 1

    def _clear(self, slot: int) -> None:
        for stack in self._stacks.values():
            if stack.filled[slot]:
                stack.a[slot] = 0
                stack.b[slot] = 0
                stack.scale[slot] = 0
                stack.filled[slot] = False
                mx.eval(stack.a, stack.b, stack.scale)
                self.version += 1

    # -- the forward -----------------------------------------------------------

    def apply(self, name: str, x: mx.array, y: mx.array) -> mx.array:
        """y + this module's updates of the step's rows. x [..., T, in], y [..., T, out]."""
        active = self._active(name)
        if active is None:
            return y
        rows, stack = active
        if x.dtype == y.dtype and takes_dtypes(x.dtype, stack.a.dtype):
            return lora_apply(y, x, rows, stack.a, stack.b, stack.scale, validate=False)
        # Activations in another dtype than the adapters' (a family that casts, or
        # half adapters on the GPU): the update in the adapters' dtype, added in y's.
        delta = lora_delta(x.astype(stack.a.dtype), rows, stack.a, stack.b, stack.scale,
                           validate=False)
        return y + delta.astype(y.dtype)

    def stack(self, name: str) -> tuple[mx.array, mx.array, mx.array, np.ndarray] | None:
        """Module NAME's (a [L, r_max, in], b [L, r_max, out], scale float32 [L],
        filled bool [L]: slots whose adapter targets it), or None if no adapter
        placed so far targeted it."""
        stack = self._stacks.get(name)
        return None if stack is None else (stack.a, stack.b, stack.scale, stack.filled.copy())

    def step_rows(self) -> mx.array | None:
        """The step's slot per row, int32 [T] (-1: the base model), or None when
        no row has an adapter."""
        if self._rows is None:
            return None
        if self._step_rows is None:
            self._step_rows = mx.array(self._rows.astype(np.int32))
        return self._step_rows

    def _active(self, name: str) -> tuple[mx.array, _Stack] | None:
        """(the step's row slots for module NAME, its stack), or None when no row's
        adapter targets it."""
        stack = None if self._rows is None else self._stacks.get(name)
        if stack is None:
            return None
        rows = self._rows_for(stack.filled)
        return None if rows is None else (rows, stack)

    def _rows_for(self, filled: np.ndarray) -> mx.array | None:
        """The step's row slots with -1 where the row's adapter does not target the
        module; None when no row's adapter does."""
        key = filled.tobytes()
        if key not in self._module_rows:
            rows = np.where(filled[np.maximum(self._rows, 0)] & (self._rows >= 0), self._rows, -1)
            self._module_rows[key] = mx.array(rows) if (rows >= 0).any() else None
        return self._module_rows[key]

