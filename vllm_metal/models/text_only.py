"""vLLM general plugin: multimodal checkpoints are served by their language model.

mlx-lm loads the language model of Gemma 4 and Mistral 3 checkpoints (it drops
the vision tower), and the runner feeds it token ids only (Gemma 3's images are
served: models.vision). vLLM would treat the
architecture as multimodal: accept images whose placeholder tokens the model
would then read as text (a silent wrong answer), and inspect the model by
importing its image processor (torchvision). Registering vLLM's text-only
class under the multimodal name makes vLLM refuse image inputs by name and
inspect only the text model. Hybrid (Gated DeltaNet) architectures get a
declaration of their own (models/hybrid.py). Only while this platform drives
the machine.
"""

from __future__ import annotations

# HF multimodal architecture -> vLLM's class of the same language model alone.
TEXT_ONLY = {
    "Gemma4ForConditionalGeneration": "vllm.model_executor.models.gemma4:Gemma4ForCausalLM",
    "Mistral3ForConditionalGeneration": "vllm.model_executor.models.mistral:MistralForCausalLM",
}


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    if not type(current_platform).__module__.startswith("vllm_metal"):
        return
    for arch, target in TEXT_ONLY.items():
        ModelRegistry.register_model(arch, target)
    from vllm_metal.models.hybrid import GATED_DELTANET_ARCHITECTURES

    for arch in GATED_DELTANET_ARCHITECTURES:
        ModelRegistry.register_model(arch, "vllm_metal.models.hybrid:GatedDeltaNetHybrid")
