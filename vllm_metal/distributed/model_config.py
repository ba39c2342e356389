"""vLLM's ModelConfig with the one check this platform answers differently: tensor
parallel need not divide the query heads.

vLLM's GPU layers split heads evenly and refuse a --tensor-parallel-size that does
not divide them. vllm-metal splits heads by KV group and pads the ranks holding
fewer (distributed/tensor.py), so SmolLM2-135M's 9 heads run on 2 ranks; the model's
own shapes are checked when it is sharded.
"""

from __future__ import annotations

from vllm.config import ModelConfig


class MetalModelConfig(ModelConfig):
    """The engine's model config on this platform (engine_defaults adopts it). It is
    pickled by its class, so the engine core, which verifies the config again after
    its handshake, runs this check too."""

    def verify_with_parallel_config(self, parallel_config) -> None:
        size = parallel_config.tensor_parallel_size
        if size == 1 or self.model_arch_config.total_num_attention_heads % size == 0:
            return super().verify_with_parallel_config(parallel_config)
        # vLLM's other checks that read the size concern context parallel and hc-sp,
        # which config_checks refuses on this platform.
        parallel_config.tensor_parallel_size = 1
        try:
            return super().verify_with_parallel_config(parallel_config)
        finally:
            parallel_config.tensor_parallel_size = size


def adopt(model_config: ModelConfig) -> None:
    """Make ``model_config`` (vLLM's, before its VllmConfig is built) a MetalModelConfig."""
    if type(model_config) is ModelConfig:
        model_config.__class__ = MetalModelConfig
