"""MetalOffloadingSpec: vLLM's offloading spec for this platform.

vLLM's OffloadingConnector keeps its scheduler side (which blocks are offloaded,
LRU/ARC eviction, the tiers' lookups); this spec gives it a host tier in a
HostRegion, the BlockCopier as its worker, and, when ``secondary_tiers`` are
configured (vLLM's ``fs`` disk tier, ...), vLLM's tiering manager over that region.
Config checks route both of vLLM's spec names here (CPUOffloadingSpec,
TieringOffloadingSpec).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from typing_extensions import override
from vllm.v1.kv_offload.base import OffloadingManager, OffloadingMetricMetadata
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (CPUPrimaryTierOffloadingManager,
                                                TieringOffloadingManager)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from vllm_metal.kv_offload.block_copier import BlockCopier, PoolViews
from vllm_metal.kv_offload.host_region import HostRegion
from vllm_metal.kv_offload.settings import LAYOUT_KEY, SPEC_NAME



class MetalOffloadingSpec(TieringOffloadingSpec):

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]
                                 ) -> dict[str, OffloadingMetricMetadata]:
        if extra_config.get("secondary_tiers"):
            return super().build_metric_definitions(extra_config)
        return CPUOffloadingSpec.build_metric_definitions(extra_config)

    @classmethod
    @override
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        if extra_config.get("secondary_tiers"):
            return super().config_info_keys(extra_config)
        return CPUOffloadingSpec.config_info_keys(extra_config)

    def __init__(self, config: OffloadingConfig) -> None:
        # A disk tier names its directory after the model and its cache dtype; the
        # layout identity joins the dtype there, so bytes written by another layout
        # (backend, compute mode, cache format) are never read back as this one's.
        identity = config.extra_config.get(LAYOUT_KEY)
        if not identity:
            raise ValueError(f"{SPEC_NAME} needs {LAYOUT_KEY} in kv_connector_extra_config "
                             "(vllm-metal's config checks set it)")
        model = dataclasses.replace(config.model, dtype=f"{config.model.dtype}|{identity}")
        super().__init__(dataclasses.replace(config, model=model))

    def _region(self) -> HostRegion:
        return HostRegion.acquire(self.config.engine_id, self.num_chunks,
                                  self.kv_bytes_per_chunk)

    @override
    def get_manager(self) -> OffloadingManager:
        if self._manager is not None:
            return self._manager
        policy = dict(num_chunks=self.num_chunks, cache_policy=self.eviction_policy,
                      cache_policy_module_path=self.cache_policy_module_path,
                      enable_events=self.kv_events_config.enable_kv_cache_events,
                      info=self.cpu_info)
        if not self.secondary_tier_configs:
            self._manager = CPUOffloadingManager(
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
                **policy)
            return self._manager
        if int(self.extra_config.get("store_threshold", 0)) >= 2:
            raise ValueError("store_threshold is not supported with secondary_tiers")
        primary = CPUPrimaryTierOffloadingManager(mmap_region=self._region(), **policy)
        tiers = []
        try:
            view = primary.get_kv_memoryview()
            for tier_config in self.secondary_tier_configs:
                tiers.append(SecondaryTierFactory.create_secondary_tier(tier_config, view,
                                                                        self))
            self._manager = TieringOffloadingManager(
                primary_tier=primary, secondary_tiers=tiers,
                tier_poll_interval_s=self.tier_poll_interval_s)
        except Exception:
            for tier in reversed(tiers):
                tier.shutdown()
            primary.shutdown()
            raise
        return self._manager

    @override
    def get_worker(self, kv_caches: PoolViews, settle=None) -> BlockCopier:
        """``kv_caches``: the runner's views of its KV pool (not vLLM's torch tensors:
        the runner hands this spec its own pool); ``settle`` waits for the device."""
        if self._worker is None:
            self._worker = BlockCopier(kv_caches, self._region(), self.blocks_per_chunk,
                                       settle or (lambda: None))
        return self._worker
