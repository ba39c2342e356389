"""LoRAManager: the worker's adapters (vLLM's add/remove/pin/list) and each step's rows.

Adapters are read and checked against the model when vLLM adds them (startup's
--lora-modules, /v1/load_lora_adapter), so a bad one is refused there and never
reaches a step. Up to --max-cpu-loras stay read in memory (least recently used
goes first, pinned ones never); one evicted is read again from its path when a
request names it. --max-loras of them are resident for the forward (LoRABank).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from vllm_metal.lora.adapter_files import AdapterError, ModuleUpdate, read_adapter
from vllm_metal.lora.bank import LoRABank
from vllm_metal.lora.layer import wrap_linears

if TYPE_CHECKING:
    from vllm.config import LoRAConfig
    from vllm.lora.request import LoRARequest

logger = logging.getLogger("vllm_metal")


class LoRAManager:
    def __init__(self, model: nn.Module, config: LoRAConfig, dtype: mx.Dtype,
                 max_position_embeddings: int | None = None) -> None:
        self.config = config
        self.max_position_embeddings = max_position_embeddings
        self.bank = LoRABank(config.max_loras, config.max_lora_rank, dtype)
        targets = list(config.target_modules) if config.target_modules else None
        self.modules = wrap_linears(model, self.bank, targets)
        if not self.modules:
            raise AdapterError("LoRA: the model has no linear layer in its decoder layers"
                               + (f" named {targets} (--lora-target-modules)" if targets else ""))
        self.capacity = config.max_cpu_loras or config.max_loras
        self._requests: dict[int, LoRARequest] = {}
        self._read: OrderedDict[int, dict[str, ModuleUpdate]] = OrderedDict()
        self._pinned: set[int] = set()
        logger.info("LoRA: %d linear layers take adapters; %d resident, %d kept read, "
                    "rank up to %d", len(self.modules), config.max_loras, self.capacity,
                    config.max_lora_rank)

    # -- vLLM's worker calls -----------------------------------------------------

    def add(self, request: LoRARequest) -> bool:
        """Read and check REQUEST's adapter; raises AdapterError with what is wrong."""
        updates = self._load(request)
        self._requests[request.lora_int_id] = request
        self._keep(request.lora_int_id, updates)
        self.bank.evict(request.lora_int_id)  # a reload replaces a resident copy
        return True

    def remove(self, adapter_id: int) -> bool:
        known = adapter_id in self._requests
        self._requests.pop(adapter_id, None)
        self._read.pop(adapter_id, None)
        self._pinned.discard(adapter_id)
        self.bank.evict(adapter_id)
        return known

    def pin(self, adapter_id: int) -> bool:
        if adapter_id not in self._requests:
            raise AdapterError(f"LoRA adapter {adapter_id} is not loaded")
        self._pinned.add(adapter_id)
        return True

    def list(self) -> set[int]:
        return set(self._requests)

    # -- the step -------------------------------------------------------------------

    def prepare_step(self, row_adapters: np.ndarray, requests: dict[int, LoRARequest]) -> None:
        """ROW_ADAPTERS int [T]: each packed row's adapter id (0: base); REQUESTS: the
        step's adapters by id, where one no longer read (evicted, or removed while a
        request using it still runs) is read again from."""

        def updates(adapter_id: int) -> dict[str, ModuleUpdate]:
            if adapter_id in self._read:
                self._read.move_to_end(adapter_id)
                return self._read[adapter_id]
            found = self._load(self._requests.get(adapter_id) or requests[adapter_id])
            self._keep(adapter_id, found)
            return found

        self.bank.prepare_step(row_adapters, updates)

    def _load(self, request: LoRARequest) -> dict[str, ModuleUpdate]:
        updates = read_adapter(request.lora_path, self.config, self.max_position_embeddings)
        where = f"LoRA adapter {request.lora_name!r} ({request.lora_path})"
        for name, update in updates.items():
            module = self.modules.get(name)
            targets = self.config.target_modules
            if module is None and targets and name.rsplit(".", 1)[-1] not in targets:
                raise AdapterError(f"{where} targets {name}, outside --lora-target-modules "
                                   f"{list(targets)}")
            if module is None:
                raise AdapterError(
                    f"{where} targets {name}, which is not a linear layer of this model's "
                    "decoder layers that takes adapters (an adapter for another model, "
                    "or a module kind such as embeddings or the LM head)")
            if (update.a.shape[1], update.b.shape[0]) != (module.in_features, module.out_features):
                raise AdapterError(
                    f"{where}: {name} maps {update.a.shape[1]} -> {update.b.shape[0]} features "
                    f"but the model's layer maps {module.in_features} -> "
                    f"{module.out_features} (an adapter for another model or size)")
        return updates

    def _keep(self, adapter_id: int, updates: dict[str, ModuleUpdate]) -> None:
        self._read[adapter_id] = updates
        self._read.move_to_end(adapter_id)
        while len(self._read) > self.capacity:
            victim = next((a for a in self._read
                           if a not in self._pinned and a not in self.bank.resident()), None)
            if victim is None:
                break
            del self._read[victim]
