"""Sampling features this platform cannot honour, refused with what to change.

vLLM's own front end and scheduler already handle n, stop strings, stop_token_ids,
max_tokens, ignore_eos, detokenize, output_kind, repetition_detection and
skip_reading_prefix_cache, and validate value ranges in SamplingParams._verify_args
and SamplingParams.verify; those are not re-checked here.
"""

from __future__ import annotations

import math
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class UnsupportedSamplingError(VLLMValidationError, ValueError):
    """A request or engine setting the vllm-metal sampler cannot honour (HTTP 400)."""


def _refuse(parameter: str, message: str) -> None:
    raise UnsupportedSamplingError(f"vllm-metal: {message}", parameter=parameter)


# Input modalities the served model's encoders take (models.vision), set once the
# process knows its model.
_served_modalities: frozenset[str] = frozenset()


def remember_modalities(vllm_config: VllmConfig) -> None:
    global _served_modalities
    from vllm_metal.models.vision import vision_model_type

    model = vllm_config.model_config
    config = getattr(model, "hf_config", None)
    mm = getattr(model, "multimodal_config", None)
    served = (config is not None and vision_model_type(config.to_dict()) is not None
              and not (mm is not None and mm.language_model_only))
    _served_modalities = frozenset({"image"} if served else ())


def check_engine_input(engine_input) -> None:
    """Refuse (HTTP 400) inputs the runner cannot feed a model: images, audio or video
    of a model whose encoder for them does not run here (the runner would pass their
    placeholder tokens to the language model as text, a silent wrong answer) and
    prompt embeddings (the runner feeds token ids). ``engine_input``: vLLM's
    EngineInput (a decoder-only input, or an encoder/decoder pair of them)."""
    parts = [engine_input.get("encoder"), engine_input.get("decoder")] if (
        "encoder" in engine_input or "decoder" in engine_input) else [engine_input]
    for part in parts:
        if not part:
            continue
        if part.get("type") == "embeds":
            _refuse("prompt_embeds", "prompt embeddings are not supported; send text or "
                    "token ids")
        placeholders = part.get("mm_placeholders") or {}
        modalities = sorted(k for k, v in placeholders.items()
                            if v and k not in _served_modalities)
        if modalities:
            _refuse("messages", f"{' and '.join(modalities)} inputs are not served yet (the "
                    "model's encoder for them does not run on this platform); send text only")


def check_sampling_params(params: SamplingParams) -> None:
    """Raise UnsupportedSamplingError (a ValueError) naming the field to change."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    if params.prompt_logprob_token_ids is not None or params.prompt_logprob_start is not None:
        _refuse("prompt_logprob_token_ids",
                "prompt_logprob_token_ids / prompt_logprob_start (fixed-id prompt "
                "scoring) are not supported; request prompt_logprobs=k instead")
    if params.thinking_token_budget is not None:
        _refuse("thinking_token_budget",
                "thinking_token_budget (a limit on reasoning tokens; Anthropic's "
                "thinking.budget_tokens with thinking.type 'enabled') is not supported; "
                "remove it, or send thinking.type 'adaptive' or 'disabled'")
    if params.trace_decode_token_ids:
        _refuse("trace_decode_token_ids",
                "trace_decode_token_ids (trace replay) is not supported; remove it")
    seed = params.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        _refuse("seed", f"seed must be an integer, got {seed!r}")
    if params.logit_bias:
        for token, bias in params.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int):
                _refuse("logit_bias", f"logit_bias keys must be integer token ids, "
                                      f"got {token!r}")
            # from_optional clamps to [-100, 100], a directly built SamplingParams does not.
            if not isinstance(bias, (int, float)) or not math.isfinite(bias):
                _refuse("logit_bias", f"logit_bias[{token}] must be a finite number, "
                                      f"got {bias!r}")


def check_sampling_config(vllm_config: VllmConfig) -> None:
    """Engine-wide sampling options the sampler does not implement: raise at startup."""
    model = vllm_config.model_config
    if getattr(vllm_config, "watermark_config", None) is not None:
        _refuse("watermark_config",
                "watermarking is not supported; remove --watermark-config")
    if model is None:
        return
    if model.logits_processors:
        _refuse("logits_processors",
                "custom logits processors are not run by vllm-metal; remove "
                "--logits-processors")
    plugins = sorted(ep.name for ep in entry_points(group="vllm.logits_processors"))
    if plugins:
        _refuse("logits_processors",
                f"installed logits-processor plugins {plugins} would be ignored by "
                "vllm-metal; uninstall them")
    if model.return_sampling_mask:
        _refuse("return_sampling_mask",
                "returning sampling masks is not supported; remove --return-sampling-mask")
    if model.enable_trace_replay:
        _refuse("enable_trace_replay",
                "trace replay is not supported; remove --enable-trace-replay")
    if model.use_fp64_gumbel:
        _refuse("use_fp64_gumbel",
                "float64 Gumbel noise is not supported (MLX samples in float32); "
                "remove --use-fp64-gumbel")
