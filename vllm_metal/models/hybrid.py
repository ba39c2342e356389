"""vLLM's view of a hybrid checkpoint (full attention between Gated DeltaNet layers).

vLLM decides from the model class of an architecture whether the model is hybrid
(``is_hybrid``: its layers keep a recurrent state next to paged K/V). Its own
classes for Qwen3.5 import the multimodal processors, and with them torchvision,
merely to be inspected; on this platform mlx-lm runs the model and the runner
declares each layer's cache, so vLLM needs only the declaration. This class is
that declaration: it is never instantiated to compute.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

# HF architectures whose linear-attention layers are Gated DeltaNet in mlx-lm.
GATED_DELTANET_ARCHITECTURES = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)


class GatedDeltaNetHybrid(torch.nn.Module):
    """Declares vLLM's hybrid interface (IsHybrid) for the architectures above; the
    state shapes follow the HF text config (conv [K - 1, 2 Hk Dk + Hv Dv] and
    recurrent [Hv, Dv, Dk], both float32, as the runner keeps them)."""

    is_hybrid: ClassVar[Literal[True]] = True

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        raise RuntimeError("vllm-metal runs this model with mlx-lm; the vLLM class only "
                           "declares it")

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs):
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor):
        raise NotImplementedError

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config) -> tuple[tuple[int, ...], ...]:
        text = vllm_config.model_config.hf_text_config
        hk, hv = text.linear_num_key_heads, text.linear_num_value_heads
        dk, dv = text.linear_key_head_dim, text.linear_value_head_dim
        return ((text.linear_conv_kernel_dim - 1, 2 * hk * dk + hv * dv), (hv, dv, dk))

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.float32)

    @classmethod
    def get_mamba_state_copy_func(cls):
        raise NotImplementedError("the runner moves states itself")
