"""MetalPlatform: what vLLM needs to know about an MLX device (Metal GPU or CPU)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm_metal")

WORKER_QUALNAME = "vllm_metal.v1.worker.MetalWorker"


def _backend():
    # The device's facts come from its backend (vllm_metal.backend); the worker
    # chooses the same one with the same function.
    from vllm_metal.backend import select_backend

    return select_backend()


class MetalPlatform(Platform):
    _enum = PlatformEnum.OOT
    # vLLM treats the device as host memory: torch tensors at the boundary live
    # on the CPU and MLX shares them (unified memory on Apple Silicon).
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    ray_device_key: str = ""
    device_control_env_var: str = "VLLM_METAL_VISIBLE_DEVICES"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # `--dtype auto` picks from this list.
        return _backend().supported_dtypes()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        import mlx.core as mx

        name = mx.device_info().get("device_name", "")
        return f"{name} ({_backend().label})".strip()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return _backend().device_memory_bytes()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's own `_C` kernels do not exist on this platform; ours load lazily
        # through vllm_metal.native.get_ops().
        return None

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        return None

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        import mlx.core as mx

        return float(mx.get_active_memory())

    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        """Before vLLM builds its config: this platform's engine-argument defaults."""
        from vllm_metal import engine_defaults

        engine_defaults.install()

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """Adapt vLLM's config to this platform. Runs in every process: idempotent."""
        from vllm_metal import compat
        from vllm_metal.config_checks import check_vllm_config
        from vllm_metal.distributed.host_share import remember_engines
        from vllm_metal.structured_output_options import remember_server_config
        from vllm_metal.v1.param_support import remember_modalities

        compat.apply_all()
        check_vllm_config(vllm_config)
        mm = getattr(vllm_config.model_config, "multimodal_config", None)
        if mm is not None and not mm.language_model_only:
            from vllm_metal.models.vision import lacks_tower_weights

            model = vllm_config.model_config
            if lacks_tower_weights(model.model, model.hf_config.to_dict()):
                # No tower to encode images with: vLLM then serves the text model and
                # refuses images itself (HTTP 400), as with --language-model-only.
                logger.info("%s has no vision weights: serving its language model only",
                            model.model)
                mm.language_model_only = True
        remember_engines(vllm_config)
        remember_server_config(vllm_config)
        remember_modalities(vllm_config)
        model = vllm_config.model_config
        if model is not None and model.is_encoder_decoder:
            from vllm_metal.models.whisper_prompts import use_whisper_prompts

            use_whisper_prompts(model.hf_config)

        if mm is not None:
            # The vision towers (models.vision) take pixels as the HF processor
            # normalises them; vLLM would otherwise send raw uint8 bytes for some
            # models (Qwen2.5-VL) and leave the rescale to its own torch tower.
            mm.mm_device_do_normalize = False
        scheduler = vllm_config.scheduler_config
        if (vllm_config.model_config is not None and vllm_config.model_config.is_mm_prefix_lm
                and scheduler.is_multimodal_model):
            # An image's tokens attend to the whole image (Gemma 3): its keys must all
            # be in the step that computes them, so a prompt chunk never splits an
            # image (vLLM's CUDA platform does the same).
            scheduler.disable_chunked_mm_input = True

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_QUALNAME

        from vllm.config import CompilationMode, CUDAGraphMode

        # MLX builds its own graphs; torch.compile and CUDA graphs have no role here.
        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Reject request parameters and inputs the runner cannot honour, and
        structured-output options vLLM would drop (answered as HTTP 400)."""
        from vllm import SamplingParams

        from vllm_metal.v1.param_support import check_engine_input

        check_engine_input(processed_inputs)
        if isinstance(params, SamplingParams):
            from vllm_metal.structured_output_options import check_structured_output_options
            from vllm_metal.v1.param_support import check_sampling_params

            check_sampling_params(params)
            check_structured_output_options(params)

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        # The runner reads one block table per KV cache group: sliding-window
        # layers give back the blocks that left their window.
        return True

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def validate_environ(cls, hard_fail: bool) -> None:
        """vLLM's check of ``VLLM_*`` variables, knowing this plugin's own.

        vLLM warns about (or, with ``hard_fail``, refuses) every ``VLLM_*``
        variable it does not define, which would include the ``VLLM_METAL_*``
        settings documented in docs/configuration.md. Those are parsed here
        instead: vLLM calls this while building the engine config, so a bad
        value fails at once, naming the variable, rather than when the engine
        process reads it.
        """
        from vllm import envs as vllm_envs

        from vllm_metal import envs as metal_envs

        for name in os.environ:
            if (not name.startswith("VLLM_") or name in vllm_envs.environment_variables
                    or name in metal_envs.VARIABLES):
                continue
            if hard_fail:
                raise ValueError(f"Unknown vLLM environment variable detected: {name}")
            logger.warning("Unknown vLLM environment variable detected: %s", name)
        for name in metal_envs.VARIABLES:
            if name in os.environ:
                getattr(metal_envs, name)  # ValueError naming the variable
