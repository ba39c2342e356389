"""What each supported GGUF `general.architecture` is to mlx-lm: model type, the
converter's tensor transforms, and the HF config keys only that family has.

The facts follow llama.cpp's converter (convert_hf_to_gguf) and loader:
- Q/K rows are permuted for families llama.cpp runs with "normal" (pairwise) RoPE;
  the rest use HF's half-split ("neox") layout and are stored as is.
- Gemma's RMSNorm scales by (1 + w); the converter stores 1 + w, mlx-lm expects w.
- Values llama.cpp hard-codes instead of storing (Gemma 3's local RoPE base and window
  pattern, Gemma 2/3's query scale rule) are taken the same way here, so a file runs
  as llama.cpp runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from vllm_metal.gguf.rope_scaling import rope_scaling_from_gguf

# llama.cpp's loader defaults when a Gemma 2 file lacks the softcap keys.
_GEMMA2_ATTN_SOFTCAP, _GEMMA2_FINAL_SOFTCAP = 50.0, 30.0
# llama.cpp: Gemma 3 windows every layer but each 6th; local layers use RoPE base 1e4.
_GEMMA3_PATTERN, _GEMMA3_LOCAL_BASE = 6, 10_000.0
# llama.cpp scales queries by 1/sqrt(hidden / heads) for the 27B models (these layer
# counts), by 1/sqrt(head_dim) otherwise; neither file format stores the scalar.
_GEMMA2_27B_LAYERS, _GEMMA3_27B_LAYERS = 46, 62
_SMOLLM3_NO_ROPE_STEP = 4
_GPT_OSS_PERIOD = 2  # llama.cpp's default: even layers slide
_SOFTMAX, _SIGMOID = 1, 2  # llama.cpp's expert_gating_func values
_GLM_FLASH_VOCAB = 154_880


class Metadata:
    """`{arch}.*` metadata keys of one file, read with names in errors, and which
    tensors the file has."""

    def __init__(self, metadata: dict[str, Any], arch: str, tensors: Collection[str]):
        self.raw, self.arch, self.tensors = metadata, arch, tensors

    def get(self, key: str, default: Any = ...) -> Any:
        """Value of `{arch}.{key}`; ValueError naming the key if absent and no default."""
        value = self.raw.get(f"{self.arch}.{key}")
        if value is None:
            if default is ...:
                raise ValueError(f"GGUF metadata lacks required key {self.arch + '.' + key!r}")
            return default
        return value

    def uniform(self, key: str, default: Any = ...) -> Any:
        """Like `get`, for keys some converters write once per layer (all equal here)."""
        value = self.get(key, default)
        if isinstance(value, list):
            if not value or any(v != value[0] for v in value):
                raise ValueError(f"GGUF {self.arch}.{key} varies across layers ({value}); "
                                 "not supported")
            return value[0]
        return value


@dataclass(frozen=True)
class Architecture:
    """One GGUF architecture.

    `extra(md, config)` returns the family's own HF config keys given the common ones.
    """

    hf_architecture: str
    model_type: str
    gguf_arch: str  # gguf.MODEL_ARCH member name (tensor name table)
    pairwise_rope: bool  # converter permuted Q/K rows
    norm_offset: float  # converter added this to every `*norm.weight`
    hidden_act: str
    layer_norm: bool = False  # LayerNorm with bias (eps under layer_norm_epsilon)
    latent: bool = False  # MLA: key/value/RoPE sizes are the family's own keys
    extra: Callable[[Metadata, dict[str, Any]], dict[str, Any]] | None = None


def _biases(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": "blk.0.attn_q.bias" in md.tensors,
            "mlp_bias": "blk.0.ffn_up.bias" in md.tensors}


def _qwen(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"use_sliding_window": False, "sliding_window": None,
            "max_window_layers": config["num_hidden_layers"]}


def _gemma_query_scalar(config: dict[str, Any], layers_27b: int) -> int:
    if config["num_hidden_layers"] == layers_27b:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def _gemma2(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": float(md.get("attn_logit_softcapping", _GEMMA2_ATTN_SOFTCAP)),
        "final_logit_softcapping": float(md.get("final_logit_softcapping",
                                                _GEMMA2_FINAL_SOFTCAP)),
        "query_pre_attn_scalar": _gemma_query_scalar(config, _GEMMA2_27B_LAYERS),
        "sliding_window": int(md.get("attention.sliding_window", 4096)),
    }


def _gemma3(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    if md.get("final_logit_softcapping", None) is not None:
        # mlx-lm's gemma3_text has no final softcap; serving the file without it would
        # give wrong logits.
        raise ValueError("GGUF gemma3 file sets final_logit_softcapping, which mlx-lm's "
                         "gemma3_text model does not apply; not supported")
    window = md.get("attention.sliding_window", None)
    layers = config["num_hidden_layers"]
    pattern = md.get("attention.sliding_window_pattern", _GEMMA3_PATTERN)
    if isinstance(pattern, list):  # newer converters: one "is sliding" flag per layer
        period = _period(pattern, layers)
        pattern = period
    pattern = int(pattern) if window else 1
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": _gemma_query_scalar(config, _GEMMA3_27B_LAYERS),
        "rope_local_base_freq": float(md.get("rope.freq_base_swa", _GEMMA3_LOCAL_BASE)),
        "sliding_window": int(window) if window else config["max_position_embeddings"],
        "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                        for i in range(layers)],
    }


def _period(flags: list[Any], layers: int) -> int:
    """The n with layer i global iff (i + 1) % n == 0, from per-layer sliding flags."""
    flags = [bool(f) for f in flags]
    for n in range(1, layers + 1):
        if flags == [(i + 1) % n != 0 for i in range(layers)]:
            return n
    raise ValueError(f"GGUF gemma3 sliding-window layers {flags} do not repeat with one "
                     "period (mlx-lm's gemma3_text needs one); not supported")


def _phi3(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    window = int(md.get("attention.sliding_window", 0))
    return {
        "original_max_position_embeddings": int(
            md.get("rope.scaling.original_context_length", config["max_position_embeddings"])),
        "sliding_window": window or None,  # 0 marks Phi-4 (no window)
    }


def _granite(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        **_biases(md, config),
        "logits_scaling": float(md.get("logit_scale", 1.0)),
        "attention_multiplier": float(md.get("attention.scale", 1.0)),
        "embedding_multiplier": float(md.get("embedding_scale", 1.0)),
        "residual_multiplier": float(md.get("residual_scale", 1.0)),
    }


def _experts(md: Metadata, width_key: str | None,
             scaled: bool = False) -> tuple[int, int, int | None]:
    """(experts, experts per token, expert MLP width or None) of a MoE file.

    llama.cpp fixes each family's gating itself (its `expert_gating_func` key is read by
    DeepSeek-style families only), as mlx-lm's models do; a weight scale neither model
    applies is refused. `width_key` None: the family's experts are feed_forward_length
    wide (llama.cpp's llama and olmoe read no expert width). `scaled`: the family's
    model applies `expert_weights_scale` itself.
    """
    count, used = int(md.get("expert_count")), int(md.get("expert_used_count"))
    if not 0 < used <= count:
        raise ValueError(f"GGUF {md.arch}.expert_used_count {used} is not in 1..{count}")
    scale = float(md.get("expert_weights_scale", 0.0))
    if not scaled and scale not in (0.0, 1.0):  # llama.cpp: 0 means unset
        raise ValueError(f"GGUF {md.arch}.expert_weights_scale {scale} is not applied by "
                         f"mlx-lm's {md.arch} model; not supported")
    width = md.uniform(width_key, None) if width_key else None
    return count, used, None if width is None else int(width)


def _qwen2moe(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    count, used, width = _experts(md, "expert_feed_forward_length")
    width = width or config["intermediate_size"] // used  # llama.cpp's fallback
    shared = int(md.uniform("expert_shared_feed_forward_length", config["intermediate_size"]))
    return {**_qwen(md, config), "num_experts": count, "num_experts_per_tok": used,
            "moe_intermediate_size": width, "shared_expert_intermediate_size": shared}


def _qwen3moe(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    count, used, width = _experts(md, "expert_feed_forward_length")
    width = width or config["intermediate_size"] // used  # llama.cpp's fallback
    # llama.cpp runs every qwen3moe layer as MoE with the top-k weights renormalised.
    return {**_qwen(md, config), "num_experts": count, "num_experts_per_tok": used,
            "moe_intermediate_size": width, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True}


def _mixtral(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    count, used, _ = _experts(md, None)
    if "blk.0.attn_q.bias" in md.tensors:
        raise ValueError("GGUF llama file with experts and attention biases: mlx-lm's "
                         "mixtral model has no attention bias; not supported")
    return {"num_local_experts": count, "num_experts_per_tok": used}


def _olmoe(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    count, used, _ = _experts(md, None)
    # llama.cpp's olmoe keeps the top-k softmax weights as they are.
    return {"num_experts": count, "num_experts_per_tok": used, "norm_topk_prob": False}


def _gpt_oss(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    # Routing (top-k of the raw logits, softmax over those k) and the clamped SwiGLU are
    # fixed by llama.cpp and mlx-lm alike.
    count, used, width = _experts(md, "expert_feed_forward_length")
    base_swa = md.get("rope.freq_base_swa", None)
    if base_swa is not None and float(base_swa) != config["rope_theta"]:
        raise ValueError(f"GGUF gpt-oss.rope.freq_base_swa {base_swa} differs from "
                         "rope.freq_base; mlx-lm's gpt_oss has one RoPE base")
    period = int(md.uniform("attention.sliding_window_pattern", _GPT_OSS_PERIOD))
    # llama.cpp: layer i slides iff i % period < period - 1.
    layers = config["num_hidden_layers"]
    types = ["sliding_attention" if i % period < period - 1 else "full_attention"
             for i in range(layers)]
    if "full_attention" not in types or "sliding_attention" not in types:
        raise ValueError(f"GGUF gpt-oss sliding_window_pattern {period} over {layers} layers "
                         "leaves no sliding or no full layer; mlx-lm's gpt_oss needs both")
    return {"num_local_experts": count, "num_experts_per_tok": used,
            "intermediate_size": width if width is not None else config["intermediate_size"],
            "sliding_window": int(md.get("attention.sliding_window")), "layer_types": types}


def _deepseek2(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek V2/V3-style MLA + MoE. Sigmoid-scored files (V3, Kimi K2, GLM-4.7-Flash)
    run as mlx-lm's deepseek_v3 (absorbed MLA: attn_k_b / attn_v_b are its per-head
    matrices as stored); softmax-scored ones (V2, V2-Lite) as deepseek_v2."""
    if md.get("attention.key_length_mla", None) is None:
        raise ValueError("GGUF deepseek2 file without attention.key_length_mla: converted "
                         "before llama.cpp split attn_kv_b (MLA); re-convert it")
    count, used, width = _experts(md, "expert_feed_forward_length", scaled=True)
    rope = int(md.uniform("rope.dimension_count"))
    layers, vocab = config["num_hidden_layers"], config["vocab_size"]
    # llama.cpp's default when the key is absent: sigmoid for GLM-4.7-Flash, else softmax.
    glm_flash = layers in (47, 48) and vocab == _GLM_FLASH_VOCAB
    gating = int(md.get("expert_gating_func", _SIGMOID if glm_flash else _SOFTMAX))
    groups = int(md.get("expert_group_count", 1))
    norm = bool(md.get("expert_weights_norm", False))
    q_lora = md.get("attention.q_lora_rank", None)
    out = {
        "num_key_value_heads": config["num_attention_heads"], "head_dim": rope,
        "kv_lora_rank": int(md.get("attention.kv_lora_rank")),
        "q_lora_rank": None if "blk.0.attn_q.weight" in md.tensors or q_lora is None
        else int(q_lora),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": int(md.uniform("attention.key_length_mla")) - rope,
        "v_head_dim": int(md.uniform("attention.value_length_mla")),
        "n_routed_experts": count, "num_experts_per_tok": used,
        "moe_intermediate_size": width or config["intermediate_size"],
        "n_shared_experts": int(md.get("expert_shared_count", 0)) or None,
        "first_k_dense_replace": int(md.get("leading_dense_block_count", 0)),
        "routed_scaling_factor": float(md.get("expert_weights_scale", 0.0)) or 1.0,
        "n_group": groups, "topk_group": int(md.get("expert_group_used_count", groups)),
        "rope_scaling": _deepseek_rope(md, rope, config["rope_theta"]),
    }
    if gating == _SIGMOID:
        return {**out, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": norm}
    if gating != _SOFTMAX:
        raise ValueError(f"GGUF deepseek2.expert_gating_func {gating} is neither softmax nor "
                         "sigmoid; not supported")
    # mlx-lm's deepseek_v2 never renormalises, and limits groups by their best expert
    # where llama.cpp sums the best two: refuse what the two would run differently.
    if norm or groups > 1 or any(".exp_probs_b." in t for t in md.tensors):
        raise ValueError("GGUF deepseek2 file with softmax routing and expert_weights_norm, "
                         "expert groups or an expert bias: mlx-lm's deepseek_v2 routes "
                         "differently from llama.cpp; not supported")
    return {**out, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
            "topk_method": "greedy"}


def _deepseek_rope(md: Metadata, dims: int, base: float) -> dict[str, Any] | None:
    scaling = rope_scaling_from_gguf(md.raw, md.arch, None, dims, base)
    if scaling is None:
        return None
    if scaling["rope_type"] != "yarn":
        raise ValueError(f"GGUF deepseek2 rope scaling {scaling['rope_type']!r} is not "
                         "supported (mlx-lm's DeepSeek models take yarn)")
    # The converter stores 0.1 * mscale_all_dim; llama.cpp then takes mscale equal to it
    # (DeepSeek's configs set the two alike), which cancels in the RoPE magnitude.
    all_dim = float(md.get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
    return {**scaling, "type": "yarn", "mscale": all_dim or 1.0, "mscale_all_dim": all_dim}


def _smollm3(md: Metadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp skips RoPE on every 4th layer of SmolLM3 and stores no key for it.
    return {**_biases(md, config), "no_rope_layer_interval": _SMOLLM3_NO_ROPE_STEP}


ARCHITECTURES: dict[str, Architecture] = {
    # Mistral files are tagged "llama": same layers, run by llama.cpp as llama.
    "llama": Architecture("LlamaForCausalLM", "llama", "LLAMA", True, 0.0, "silu",
                          extra=_biases),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2", "QWEN2", False, 0.0, "silu",
                          extra=_qwen),
    "qwen3": Architecture("Qwen3ForCausalLM", "qwen3", "QWEN3", False, 0.0, "silu",
                          extra=_qwen),
    "qwen2moe": Architecture("Qwen2MoeForCausalLM", "qwen2_moe", "QWEN2MOE", False, 0.0,
                             "silu", extra=_qwen2moe),
    "qwen3moe": Architecture("Qwen3MoeForCausalLM", "qwen3_moe", "QWEN3MOE", False, 0.0,
                             "silu", extra=_qwen3moe),
    "olmoe": Architecture("OlmoeForCausalLM", "olmoe", "OLMOE", False, 0.0, "silu",
                          extra=_olmoe),
    "deepseek2": Architecture("DeepseekV3ForCausalLM", "deepseek_v3", "DEEPSEEK2", False, 0.0,
                              "silu", latent=True, extra=_deepseek2),
    "gpt-oss": Architecture("GptOssForCausalLM", "gpt_oss", "GPT_OSS", False, 0.0, "silu",
                            extra=_gpt_oss),
    "gemma": Architecture("GemmaForCausalLM", "gemma", "GEMMA", False, 1.0,
                          "gelu_pytorch_tanh"),
    "gemma2": Architecture("Gemma2ForCausalLM", "gemma2", "GEMMA2", False, 1.0,
                           "gelu_pytorch_tanh", extra=_gemma2),
    "gemma3": Architecture("Gemma3ForCausalLM", "gemma3_text", "GEMMA3", False, 1.0,
                           "gelu_pytorch_tanh", extra=_gemma3),
    "phi3": Architecture("Phi3ForCausalLM", "phi3", "PHI3", False, 0.0, "silu",
                         extra=_phi3),
    "olmo2": Architecture("Olmo2ForCausalLM", "olmo2", "OLMO2", False, 0.0, "silu"),
    "granite": Architecture("GraniteForCausalLM", "granite", "GRANITE", True, 0.0, "silu",
                            extra=_granite),
    "smollm3": Architecture("SmolLM3ForCausalLM", "smollm3", "SMOLLM3", True, 0.0, "silu",
                            extra=_smollm3),
    "starcoder2": Architecture("Starcoder2ForCausalLM", "starcoder2", "STARCODER2", False,
                               0.0, "gelu_pytorch_tanh", layer_norm=True),
}


# Mixtral files are tagged "llama" too; llama.cpp runs a layer as MoE when the file
# has experts (`llama.expert_count` > 0).
_MIXTRAL = Architecture("MixtralForCausalLM", "mixtral", "LLAMA", True, 0.0, "silu",
                        extra=_mixtral)


def architecture_of(metadata: dict[str, Any]) -> tuple[str, Architecture]:
    """(general.architecture, its facts); ValueError naming it if unsupported."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported by vllm-metal; supported: "
            f"{', '.join(ARCHITECTURES)}")
    if arch == "llama" and int(metadata.get("llama.expert_count") or 0) > 0:
        return arch, _MIXTRAL
    return arch, ARCHITECTURES[arch]
