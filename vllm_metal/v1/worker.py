"""MetalWorker: vLLM's V1 worker contract on an MLX device."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import mlx.core as mx
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from vllm_metal import envs
from vllm_metal.backend import Backend, select_backend
from vllm_metal.distributed.host_share import host_share, pin_to_share
from vllm_metal.v1.memory_budget import MemoryBudget, allocator_cache_limit
from vllm_metal.v1.model_lifecycle import parameter_bytes
from vllm_metal.v1.model_runner import MetalModelRunner

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

    from vllm_metal.v1.encoder_runner import EncoderRunner

logger = logging.getLogger("vllm_metal")


class MetalWorker(WorkerBase):
    def __init__(self, vllm_config: VllmConfig, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method,
                         is_driver_worker)
        self.model_runner: MetalModelRunner | EncoderRunner | None = None
        self.backend: Backend | None = None
        self._activation_bytes = 0

    def init_device(self) -> None:
        from vllm_metal.native import get_ops

        index, ranks = host_share(self.vllm_config, self.local_rank)
        if self.parallel_config.pipeline_parallel_size == 1:
            # Before the CPU kernel pool starts (it sizes itself from the affinity).
            pin_to_share(index, ranks)
        get_ops()  # fail early, with its message, if the extension is unusable
        # The one choice of backend; the model's load and the runner get this object.
        self.backend = select_backend()
        self.backend.init_device()
        seed = self.model_config.seed
        if seed is not None:
            mx.random.seed(seed)
        mlx_group = self._init_distributed()
        runner = MetalModelRunner
        if self.model_config.attn_type == "encoder_only":
            from vllm_metal.v1.encoder_runner import EncoderRunner

            runner = EncoderRunner   # config_checks let through BERT-class ones only
        elif self.model_config.is_encoder_decoder:
            from vllm_metal.v1.speech_runner import SpeechRunner

            runner = SpeechRunner    # config_checks let through Whisper only
        self.model_runner = runner(self.vllm_config, self.backend, mlx_group)

    def _init_distributed(self):
        """Join vLLM's process groups (gloo: its control traffic, and what vLLM's code
        paths consult) and, on several ranks, the MLX group the hidden states travel
        in; returns that group (None on one rank)."""
        from vllm.distributed import (ensure_model_parallel_initialized, get_world_group,
                                      init_distributed_environment)

        parallel = self.parallel_config
        init_distributed_environment(world_size=parallel.world_size, rank=self.rank,
                                     distributed_init_method=self.distributed_init_method,
                                     local_rank=self.local_rank, backend="gloo")
        ensure_model_parallel_initialized(parallel.tensor_parallel_size,
                                          parallel.pipeline_parallel_size)
        group = None
        if parallel.world_size > 1:
            from vllm_metal.distributed.group import join_mlx_group

            group = join_mlx_group(get_world_group().cpu_group, self.rank, parallel.world_size,
                                   same_host=parallel.nnodes == 1,
                                   backend=envs.VLLM_METAL_DISTRIBUTED_BACKEND)
        self.backend.quiet_threads()  # gloo's idle loop threads
        return group

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("vllm-metal does not support --load-format dummy")
        self.model_runner.load_model()

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.model_runner.get_kv_cache_spec()

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["NHD"]

    def set_kv_cache_layout(self, *args, **kwargs) -> None:
        return None

    def determine_available_memory(self) -> int:
        cache_config = self.vllm_config.cache_config
        runner = self.model_runner
        estimate = runner.profile_run()
        self._activation_bytes = estimate.total
        cache_limit = allocator_cache_limit(estimate.arrays)
        mx.set_cache_limit(cache_limit)
        budget = MemoryBudget(
            # The ranks on one host share its memory.
            device_total=(self.backend.device_memory_bytes()
                          // host_share(self.vllm_config, self.local_rank)[1]),
            utilization=float(cache_config.gpu_memory_utilization),
            weights=parameter_bytes(runner.loaded.model) + runner.draft_parameter_bytes(),
            activations=self._activation_bytes,
            allocator_cache=cache_limit,
        )
        explicit = getattr(cache_config, "kv_cache_memory_bytes", None)
        if explicit:
            kv_bytes, source = int(explicit), " (--kv-cache-memory)"
        else:
            kv_bytes, source = budget.kv_cache_bytes(
                runner.kv_bytes_per_block(), runner.block_size, runner.max_model_len,
                runner.max_num_reqs, cap=self.backend.kv_cache_cap(),
                one_request=runner.kv_bytes_per_request()), ""
        logger.info("Memory budget %.2f GiB: weights %.2f GiB, activations %.2f GiB, "
                    "allocator cache %.2f GiB, KV cache %.2f GiB%s", budget.budget / 2**30,
                    budget.weights / 2**30, budget.activations / 2**30,
                    budget.allocator_cache / 2**30, kv_bytes / 2**30, source)
        # vLLM sizes the pool by the target's pages; a draft model's cache takes the
        # rest of each block's bytes.
        return int(kv_bytes * runner.target_kv_fraction())

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len
        self.model_runner.max_model_len = max_model_len

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # MLX compiles nothing ahead of time; the profiling forward already
        # touched every kernel once.
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def get_kv_connector_handshake_metadata(self) -> None:
        # The one connector served here (offloading) exchanges nothing between workers.
        return None

    def get_supported_tasks(self):
        pooling = self.model_runner.pooling
        if pooling is not None:
            return pooling.supported_tasks()
        if self.model_config.is_encoder_decoder:
            return ("transcription",)   # as vLLM's runner gives Whisper
        return ("generate",)

    def execute_model(self, scheduler_output: SchedulerOutput):
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: GrammarOutput | None):
        return self.model_runner.sample_tokens(grammar_output)

    def execute_dummy_batch(self) -> None:
        return None

    def take_draft_token_ids(self):
        return self.model_runner.take_draft_token_ids()

    def get_cache_block_size_bytes(self) -> int:
        return self.model_runner.kv_bytes_per_block()

    def check_health(self) -> None:
        return None

    def reset_mm_cache(self) -> None:
        return None

    def reset_encoder_cache(self) -> None:
        """Forget every encoder output (vLLM's scheduler forgets its side alongside)."""
        cache = self.model_runner.encoder_cache
        if cache is not None:
            cache.outputs.clear()

    def add_lora(self, lora_request) -> bool:
        return self._lora().add(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora().remove(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self._lora().pin(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora().list()

    def _lora(self):
        if self.model_runner is None or self.model_runner.lora is None:
            raise ValueError("LoRA adapters need --enable-lora")
        return self.model_runner.lora

    def shutdown(self) -> None:
        if self.model_runner is not None and self.model_runner.connector is not None:
            self.model_runner.connector.shutdown()
        self.model_runner = None
