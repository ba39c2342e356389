"""ConnectorLink: the runner's side of vLLM's KV connector, one step at a time.

The order is vLLM's GPU runner's (v1/worker/kv_connector_model_runner_mixin.py):
preemption flushes, then this step's loads (a request running this step needs its
blocks first), the forward, then the stores the step completed, queued for the
next step's start, and the transfer results for the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm.v1.outputs import KVConnectorOutput

from vllm_metal.kv_offload.block_copier import PoolViews

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig


class ConnectorLink:

    def __init__(self, connector) -> None:
        self._connector = connector

    @classmethod
    def attach(cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig,
               pool_views: PoolViews, settle: Callable[[], None]) -> ConnectorLink | None:
        """Start vLLM's connector for this worker when --kv-transfer-config (or
        --kv-offloading-size) asks for one, and hand its spec the runner's pool."""
        from vllm.distributed.kv_transfer import (ensure_kv_transfer_initialized,
                                                  get_kv_transfer_group,
                                                  has_kv_transfer_group)

        ensure_kv_transfer_initialized(vllm_config, kv_cache_config)
        if not has_kv_transfer_group():
            return None
        connector = get_kv_transfer_group()
        # vLLM's register_kv_caches reads torch tensors laid out as its GPU runner
        # lays them; this platform's spec takes views of the MLX pool instead.
        side = connector.connector_worker
        if side.worker is not None:
            # vLLM keeps one connector per process: it is another live engine's.
            raise RuntimeError("another engine in this process holds vLLM's KV connector; "
                               "shut it down before starting one with KV offloading")
        side.worker = side.spec.get_worker(pool_views, settle)
        return cls(connector)

    def begin(self, scheduler_output: SchedulerOutput) -> None:
        """Before the step's forward: run the transfers the scheduler asked for."""
        meta = scheduler_output.kv_connector_metadata
        assert meta is not None, "the scheduler sends connector metadata every step"
        self._connector.handle_preemptions(meta)
        self._connector.bind_connector_metadata(meta)
        self._connector.start_load_kv(None)

    def end(self, scheduler_output: SchedulerOutput) -> KVConnectorOutput:
        """After the step's forward is queued: this step's results for the scheduler."""
        connector = self._connector
        connector.wait_for_save()
        results = connector.get_transfer_results(scheduler_output.finished_req_ids)
        output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            failed_recving=results.failed_recving,
            invalid_block_ids=connector.get_block_ids_with_load_errors(),
            kv_connector_stats=connector.get_kv_connector_stats(),
            kv_cache_events=connector.get_kv_connector_kv_cache_events(),
            kv_connector_worker_meta=connector.build_connector_worker_meta())
        connector.clear_connector_metadata()
        return output

    @staticmethod
    def shutdown() -> None:
        from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

        ensure_kv_transfer_shutdown()
