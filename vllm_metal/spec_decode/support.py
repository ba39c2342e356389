"""Which --speculative-config settings this platform runs, refused by name otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Methods the runner proposes drafts for (drafters.py).
METHODS = ("ngram", "draft_model")
# Methods whose drafts need no KV cache of their own (prompt lookup).
CACHELESS_METHODS = ("ngram",)
# Drafts per step past which verification costs more rows than any acceptance rate
# repays on this platform; vLLM's own rejection sampler stops at 128.
MAX_SPECULATIVE_TOKENS = 32


def check_method(method: str) -> None:
    if method not in METHODS:
        from vllm_metal.config_checks import UnsupportedConfigError

        raise UnsupportedConfigError(
            f"--speculative-config: method {method!r} is not supported by vllm-metal; "
            f"use one of {', '.join(METHODS)} (MTP and EAGLE heads: mlx-lm 0.32.2 loads "
            "none)")


def check_scheduling(async_scheduling: bool | None) -> None:
    if async_scheduling:
        from vllm_metal.config_checks import UnsupportedConfigError

        raise UnsupportedConfigError(
            "speculative decoding runs with synchronous scheduling on vllm-metal: "
            "remove --async-scheduling (or pass --no-async-scheduling)")


def check_speculative_config(vllm_config: VllmConfig) -> None:
    """Raise ValueError naming the field of --speculative-config to change."""
    spec = vllm_config.speculative_config
    if spec is None:
        return
    from vllm_metal.config_checks import UnsupportedConfigError

    def refuse(message: str) -> None:
        raise UnsupportedConfigError(f"--speculative-config: {message}")

    check_method(spec.method)
    k = spec.num_speculative_tokens
    if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        refuse(f"num_speculative_tokens={k!r}: use 1 to {MAX_SPECULATIVE_TOKENS}")
    if spec.rejection_sample_method != "standard":
        refuse(f"rejection_sample_method={spec.rejection_sample_method!r} is not "
               "supported; remove it (the standard rule keeps the target's distribution)")
    if spec.draft_sample_method != "greedy":
        refuse(f"draft_sample_method={spec.draft_sample_method!r} is not supported; "
               "remove it (drafts are the draft model's argmax)")
    if spec.parallel_drafting:
        refuse("parallel_drafting is not supported; remove it")
    if spec.num_speculative_tokens_per_batch_size is not None:
        refuse("num_speculative_tokens_per_batch_size is not supported; remove it")
    if spec.quantization is not None:
        refuse(f"quantization={spec.quantization!r} is not supported; remove it "
               "(the draft loads as its checkpoint is stored)")
    draft_tp = spec.draft_tensor_parallel_size
    if draft_tp not in (None, 1):
        refuse(f"draft_tensor_parallel_size={draft_tp} is not supported; use 1")
    if spec.kv_cache_dtype not in (None, "auto"):
        refuse(f"kv_cache_dtype={spec.kv_cache_dtype!r} is not supported; remove it "
               "(the draft's cache takes the target's dtype)")
    check_scheduling(vllm_config.scheduler_config.async_scheduling)
