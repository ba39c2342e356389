"""Refuse engine configurations this platform cannot run, with the flag to change."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vllm_metal.attention.kv_quant import CACHE_DTYPES as QUANTIZED_CACHE_DTYPES
from vllm_metal.attention.rotated_kv import PRESETS as ROTATED_PRESETS
from vllm_metal.envs import KV_CACHE_DTYPES
from vllm_metal.native.constants import KERNEL_BLOCK_SIZES

if TYPE_CHECKING:
    from vllm.config import VllmConfig


logger = logging.getLogger("vllm_metal")

# auto: the model's dtype (vLLM resolves it before the checks run). On the CPU
# stack, a half dtype halves the adapter bytes a step reads; the update is still
# accumulated in float32.
LORA_DTYPES = ("auto", "float32", "float16", "bfloat16")


# Why the turboquant presets without a kernel here (the 3-bit ones) have none.
_UNSERVED_REASON = ("3-bit keys cost about 0.3 nats of next-token KL on the bundled model, so "
                    "no kernel was built for them")


class UnsupportedConfigError(ValueError):
    pass


def check_vllm_config(vllm_config: VllmConfig) -> None:
    _check_runner(vllm_config)
    _check_vision(vllm_config)
    _check_encoder_decoder(vllm_config)
    parallel = vllm_config.parallel_config
    for flag, value in (("--decode-context-parallel-size", parallel.decode_context_parallel_size),
                        ("--prefill-context-parallel-size",
                         parallel.prefill_context_parallel_size)):
        if value != 1:
            raise UnsupportedConfigError(f"{flag} {value}: context parallel is not implemented "
                                         "on vllm-metal; use 1")
    for flag, on in (("--enable-expert-parallel", parallel.enable_expert_parallel),
                     ("--enable-hc-sp", parallel.enable_hc_sp)):
        if on:
            raise UnsupportedConfigError(f"{flag} is not implemented on vllm-metal; drop it")
    sizes = [(flag, size) for flag, size in (
        ("--tensor-parallel-size", parallel.tensor_parallel_size),
        ("--pipeline-parallel-size", parallel.pipeline_parallel_size),
        ("--data-parallel-size", parallel.data_parallel_size)) if size != 1]
    if len(sizes) > 1:
        raise UnsupportedConfigError(
            f"{' with '.join(f'{flag} {size}' for flag, size in sizes)}: vllm-metal runs "
            "one kind of parallelism at a time yet; set the others to 1")
    tensor, pipeline = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if tensor != 1:
        _check_parallel(vllm_config, f"--tensor-parallel-size {tensor}")
    if pipeline != 1:
        _check_parallel(vllm_config, f"--pipeline-parallel-size {pipeline}")
    from vllm_metal.spec_decode.support import check_speculative_config

    check_speculative_config(vllm_config)
    lora = vllm_config.lora_config
    if lora is not None and str(lora.lora_dtype).removeprefix("torch.") not in LORA_DTYPES:
        raise UnsupportedConfigError(
            f"--lora-dtype {lora.lora_dtype} is not supported; use auto (the model's dtype), "
            f"{', '.join(LORA_DTYPES[1:])}")

    from vllm_metal.v1.param_support import check_sampling_config

    check_sampling_config(vllm_config)

    from vllm_metal.kv_offload.settings import route_kv_transfer

    route_kv_transfer(vllm_config)

    cache = vllm_config.cache_config
    if cache.cache_dtype in ROTATED_PRESETS and cache.cache_dtype not in QUANTIZED_CACHE_DTYPES:
        raise UnsupportedConfigError(
            f"--kv-cache-dtype {cache.cache_dtype} is not supported: "
            f"{_UNSERVED_REASON} (docs/kv-cache.md states each preset's "
            "measured accuracy); use turboquant_4bit_nc or turboquant_k8v4 for a cache of "
            "about 0.28x or 0.41x the float16 bytes, or fp8 / int8_per_token_head for about half")
    if cache.cache_dtype not in (None, *KV_CACHE_DTYPES, *QUANTIZED_CACHE_DTYPES):
        raise UnsupportedConfigError(
            f"--kv-cache-dtype {cache.cache_dtype} is not supported; use one of "
            f"{', '.join((*KV_CACHE_DTYPES, *QUANTIZED_CACHE_DTYPES))} (auto: the model's "
            "dtype; fp8 is e4m3)")
    block_size = cache.block_size
    smallest = min(KERNEL_BLOCK_SIZES)
    if block_size is not None and (block_size <= 0 or block_size % smallest != 0):
        raise UnsupportedConfigError(
            f"--block-size {block_size} is not supported: it must be a multiple of "
            f"{smallest} (the paged kernels use pages of {KERNEL_BLOCK_SIZES})")


# LLaVA's language models mlx-lm builds (its llava wrapper builds Llama unless told
# Ministral 3 or Mistral 4): any other would load into the wrong class.
_LLAVA_TEXT = ("llama", "mistral", "ministral3", "mistral4")


def _check_vision(vllm_config: VllmConfig) -> None:
    model = vllm_config.model_config
    config = getattr(model, "hf_config", None) if model is not None else None
    if getattr(config, "model_type", None) != "llava":
        return
    text = getattr(config.get_text_config(), "model_type", "llama")
    if text not in _LLAVA_TEXT:
        raise UnsupportedConfigError(
            f"{model.model}: a LLaVA checkpoint with a {text} language model is not served "
            f"(mlx-lm builds LLaVA's language model as one of {', '.join(_LLAVA_TEXT)})")


def _check_runner(vllm_config: VllmConfig) -> None:
    """A pooling runner is served for a causal decoder converted to embeddings or to a
    classifier (--convert embed / classify, which vLLM also picks for
    sentence-transformers and *ForSequenceClassification checkpoints) and for the
    BERT-class encoders of vllm_metal.models.encoder; other pooling models are refused
    by name rather than served as something else."""
    model = vllm_config.model_config
    if model is None or model.runner_type != "pooling":
        return
    from vllm_metal.v1.pooling import SERVED_CONVERSIONS

    convert = model.convert_type
    how = (f"{model.architecture} as --runner pooling"
           + (f" --convert {convert}" if convert != "none" else ""))
    if model.attn_type == "encoder_only" and convert == "none":
        _check_encoder(vllm_config, how)
    elif convert not in SERVED_CONVERSIONS:
        raise UnsupportedConfigError(
            f"{how}: this pooling architecture is not served by vllm-metal yet; causal "
            "decoders are (as --convert embed or --convert classify), and BERT, RoBERTa "
            "and XLM-RoBERTa encoders")
    elif model.attn_type != "decoder":
        # The paged kernels attend causally: a bidirectional decoder would pool
        # hidden states it was never trained to give.
        raise UnsupportedConfigError(
            f"{how}: its attention is bidirectional ({model.attn_type}); "
            "vllm-metal pools causal decoders and BERT-class encoders only yet")
    stages = vllm_config.parallel_config.pipeline_parallel_size
    if stages != 1:
        raise UnsupportedConfigError(f"--pipeline-parallel-size {stages} with {how}: pooling "
                                     "runs on one pipeline stage on vllm-metal; use 1")
    if vllm_config.speculative_config is not None:
        raise UnsupportedConfigError(f"--speculative-config with {how}: a pooling model "
                                     "samples nothing to speculate on; drop it")


def _check_encoder(vllm_config: VllmConfig, how: str) -> None:
    """A BERT-class encoder: its family and layout are ours, it runs on one rank, and
    prompts stop where its position embeddings do (RoBERTa numbers positions from
    padding_idx + 1, so it holds two fewer tokens than max_position_embeddings, which
    vLLM takes for the limit)."""
    from vllm_metal.models.encoder import EncoderConfig, UnsupportedEncoderError

    model = vllm_config.model_config
    try:
        encoder = EncoderConfig.from_dict(model.hf_config.to_dict())
    except (UnsupportedEncoderError, KeyError) as e:
        raise UnsupportedConfigError(f"{how}: {e}") from None
    parallel = vllm_config.parallel_config
    if parallel.world_size != 1:
        raise UnsupportedConfigError(f"{how}: encoders run on one rank on vllm-metal; drop "
                                     "the parallel flags")
    for flag, on in (("--enable-lora", vllm_config.lora_config is not None),
                     ("--kv-offloading-size / --kv-transfer-config",
                      vllm_config.kv_transfer_config is not None)):
        if on:
            raise UnsupportedConfigError(f"{flag} with {how}: an encoder keeps no cache and "
                                         "takes no adapters on vllm-metal; drop it")
    if model.max_model_len > encoder.max_tokens:
        logger.info("%s: max_model_len %d -> %d (its position embeddings' reach)",
                    model.architecture, model.max_model_len, encoder.max_tokens)
        model.max_model_len = encoder.max_tokens
        vllm_config.scheduler_config.max_model_len = encoder.max_tokens


def _check_encoder_decoder(vllm_config: VllmConfig) -> None:
    """An encoder-decoder model is served when it is Whisper (vllm_metal.models.whisper),
    on one rank, with a float cache and none of the text runner's extras."""
    model = vllm_config.model_config
    if model is None or not model.is_encoder_decoder:
        return
    from vllm_metal.models.whisper import UnsupportedWhisperError, WhisperConfig

    how = model.architecture
    try:
        WhisperConfig.from_dict(model.hf_config.to_dict())
    except (UnsupportedWhisperError, KeyError) as e:
        raise UnsupportedConfigError(f"{how}: encoder-decoder models other than Whisper are "
                                     f"not served by vllm-metal ({e})") from None
    if vllm_config.parallel_config.world_size != 1:
        raise UnsupportedConfigError(f"{how}: Whisper runs on one rank on vllm-metal; drop "
                                     "the parallel flags")
    cache = vllm_config.cache_config
    for flag, on in (("--enable-lora", vllm_config.lora_config is not None),
                     ("--speculative-config", vllm_config.speculative_config is not None),
                     ("--kv-offloading-size / --kv-transfer-config",
                      cache.kv_offloading_size is not None
                      or getattr(vllm_config.kv_transfer_config, "kv_connector", None)
                      is not None),
                     (f"--kv-cache-dtype {cache.cache_dtype}",
                      cache.cache_dtype not in (None, "auto"))):
        if on:
            raise UnsupportedConfigError(f"{flag} with {how} is not supported on vllm-metal; "
                                         "drop it")


def _check_parallel(vllm_config: VllmConfig, given: str) -> None:
    """What pipeline stages and tensor ranks do not run yet is refused by its flag."""
    clashes = [(vllm_config.speculative_config is not None, "--speculative-config"),
               (vllm_config.lora_config is not None, "--enable-lora"),
               (vllm_config.cache_config.kv_offloading_size is not None
                or getattr(vllm_config.kv_transfer_config, "kv_connector", None) is not None,
                "--kv-offloading-size / --kv-transfer-config")]
    for clash, flag in clashes:
        if clash:
            raise UnsupportedConfigError(
                f"{given} does not run with {flag} on vllm-metal; drop one of them")
