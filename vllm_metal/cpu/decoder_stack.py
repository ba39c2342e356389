"""Run a llama-family decoder stack as one CPU graph node (``decoder_stack``).

On MLX's CPU backend the host thread spends ~10 us enqueueing each graph node
and a 30-layer decode step built module by module is ~900 nodes, so the step
is bound by enqueueing rather than arithmetic. For the models whose layer
structure we know exactly (mlx-lm's llama/mistral, qwen2 and qwen3 blocks:
pre-norm attention and SwiGLU MLP with residuals) ``plan_decoder_stack``
flattens the layers' weights into the op's spec once; each step then costs
one node. Anything else, or any layer that does not match, keeps the module
path. Only for float32 activations (the caches may be float32, float16 or bfloat16).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import ForwardContext
from vllm_metal.cpu.fast_linears import FastLinear, FastQuantizedLinear
from vllm_metal.models.adapter import ModelAdapter
from vllm_metal.native import get_ops

logger = logging.getLogger("vllm_metal")

# (module, backbone class, block class, MLP class) computing exactly the
# structure decoder_stack implements.
_KNOWN = {
    "mlx_lm.models.llama": ("LlamaModel", "TransformerBlock", "MLP"),
    "mlx_lm.models.qwen2": ("Qwen2Model", "TransformerBlock", "MLP"),
    "mlx_lm.models.qwen3": ("Qwen3Model", "TransformerBlock", "MLP"),
}


class Unsupported(Exception):
    """Why a model keeps the module path (logged once at load)."""


# The stack computes in fp32 and rounds keys and values to the cache's dtype.
_CACHE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


@dataclass
class DecoderStackPlan:
    """The model's decoder weights as the extension holds them (built once)."""

    weights: object   # vllm_metal._ext.DecoderStackWeights

    def __call__(self, x: mx.array, ctx: ForwardContext) -> mx.array:
        """x float32 [1, T, hidden] embeddings -> final-norm hidden [1, T, hidden].

        The op writes ctx's caches in place when it runs (they stay the same
        arrays); later readers are enqueued after it on the same stream.
        """
        meta = ctx.metadata
        return get_ops().decoder_stack(
            self.weights, x, ctx.key_caches, ctx.value_caches, meta.positions,
            meta.slot_mapping[0], meta.block_tables[0], meta.seq_lens, meta.cu_seqlens_q)

    def accepts(self, x: mx.array, ctx: ForwardContext) -> bool:
        # One block table for every layer: a single KV cache group.
        return (x.dtype == mx.float32 and ctx.key_caches[0].dtype in _CACHE_DTYPES
                and len(ctx.metadata.block_tables) == 1)


def plan_decoder_stack(adapter: ModelAdapter,
                       int8_activations: bool = False) -> DecoderStackPlan | None:
    """The stack's plan, or None (logged) when the model is not one we know exactly.

    ``adapter`` holds the mlx-lm backbone (linears already switched to the fast
    CPU classes) and what each layer's attention was found to do.
    ``int8_activations``: the quantized linears multiply on int8-rounded inputs.
    """
    try:
        return _plan(adapter, int8_activations)
    except Unsupported as e:
        logger.info("Decoder stack runs module by module on the CPU: %s", e)
        return None


def _plan(adapter: ModelAdapter, int8_activations: bool = False) -> DecoderStackPlan:
    backbone = adapter.backbone
    kind = type(backbone)
    names = _KNOWN.get(kind.__module__)
    if names is None or kind.__name__ != names[0]:
        raise Unsupported(f"{kind.__module__}.{kind.__name__} is not a known backbone")
    if getattr(backbone, "pipeline_size", 1) != 1:
        raise Unsupported("pipeline-parallel backbone")
    if len(adapter.entries) != len(backbone.layers):
        raise Unsupported("layers share KV entries")
    _exact_norm(backbone.norm, "final norm")
    arrays: list[mx.array] = []
    ints: list[int] = []
    floats: list[float] = []
    heads: set[tuple[int, int, int]] = set()
    for index, layer in enumerate(backbone.layers):
        where = f"layer {index}"
        if type(layer).__name__ != names[1] or type(layer).__module__ != kind.__module__:
            raise Unsupported(f"{where} is a {type(layer).__name__}")
        mlp = layer.mlp
        if type(mlp).__name__ != names[2] or type(mlp).__module__ != kind.__module__:
            raise Unsupported(f"{where}'s MLP is a {type(mlp).__name__}")
        inner = layer.self_attn
        facts = adapter.entries[index]
        if facts.has_sinks:
            raise Unsupported(f"{where} attends with sinks")
        heads.add((facts.num_heads, facts.num_kv_heads, facts.head_dim))
        linears = [inner.q_proj, inner.k_proj, inner.v_proj, inner.o_proj,
                   mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        for lin in linears:
            ints += _linear_spec(lin, where)
        qk_norm = hasattr(inner, "q_norm")
        rope = _rope_spec(inner.rope, facts.head_dim, where)
        ints += [int(qk_norm), rope["dims"], int(rope["traditional"]),
                 int(rope["freqs"] is not None), int(facts.window or 0)]
        qk_eps = 0.0
        if qk_norm:
            _exact_norm(inner.q_norm, f"{where} q_norm")
            _exact_norm(inner.k_norm, f"{where} k_norm")
            if inner.q_norm.eps != inner.k_norm.eps:
                raise Unsupported(f"{where}: q_norm and k_norm have different eps")
            qk_eps = inner.q_norm.eps
        _exact_norm(layer.input_layernorm, f"{where} input_layernorm")
        _exact_norm(layer.post_attention_layernorm, f"{where} post_attention_layernorm")
        floats += [layer.input_layernorm.eps, layer.post_attention_layernorm.eps, qk_eps,
                   rope["base"] or 0.0, rope["scale"], facts.scale, facts.softcap or 0.0]

        arrays.append(layer.input_layernorm.weight)
        for lin in linears[:4]:
            arrays += _linear_arrays(lin)
        if qk_norm:
            arrays += [inner.q_norm.weight, inner.k_norm.weight]
        arrays.append(layer.post_attention_layernorm.weight)
        for lin in linears[4:]:
            arrays += _linear_arrays(lin)
        if rope["freqs"] is not None:
            arrays.append(rope["freqs"].astype(mx.float32))
    if len(heads) != 1:
        raise Unsupported("layers differ in head counts or head size")
    (num_heads, num_kv_heads, head_dim), = heads
    hidden = int(backbone.norm.weight.shape[0])
    return DecoderStackPlan(get_ops().DecoderStackWeights(
        arrays, ints, floats, backbone.norm.weight, backbone.norm.eps, hidden, num_heads,
        num_kv_heads, head_dim, int8_activations))


def _exact_norm(module: nn.Module, where: str) -> None:
    if type(module) is not nn.RMSNorm or "weight" not in module:
        raise Unsupported(f"{where} is a {type(module).__name__}, not nn.RMSNorm")


def _linear_spec(lin: nn.Module, where: str) -> list[int]:
    has_bias = int("bias" in lin)
    if type(lin) is FastQuantizedLinear:
        return [lin.bits, lin.group_size, has_bias]
    if type(lin) is FastLinear:
        return [0, 0, has_bias]
    raise Unsupported(f"{where} has a {type(lin).__name__} the CPU kernels do not cover")


def _linear_arrays(lin: nn.Module) -> list[mx.array]:
    arrays = [lin.weight]
    if type(lin) is FastQuantizedLinear:
        arrays += [lin.scales, lin.biases]
    if "bias" in lin:
        arrays.append(lin.bias)
    return arrays


def _rope_spec(rope: nn.Module, head_dim: int, where: str) -> dict:
    """Learn what the RoPE module asks mx.fast.rope for, by calling it once.

    The module must hand its input and offset to mx.fast.rope unchanged and
    return the result unchanged (no pre-scaling as in YaRN), else Unsupported.
    """
    probe = mx.zeros((2, 1, 1, head_dim))
    offset = mx.array([0, 1], dtype=mx.int32)
    marker = mx.zeros((1,))
    seen: dict = {}

    def record(a, dims, *, traditional, base, scale, offset, freqs=None, stream=None):
        seen.update(a=a, dims=dims, traditional=traditional, base=base, scale=scale,
                    offset=offset, freqs=freqs, stream=stream)
        return marker

    fast = mx.fast
    saved = fast.rope
    fast.rope = record
    try:
        result = rope(probe, offset=offset)
    except Exception as e:  # a module that cannot take array offsets
        raise Unsupported(f"{where}: RoPE {type(rope).__name__} failed a probe: {e}") from e
    finally:
        fast.rope = saved
    if (result is not marker or seen.get("a") is not probe or seen.get("offset") is not offset
            or seen.get("stream") is not None):
        raise Unsupported(f"{where}: RoPE {type(rope).__name__} does more than mx.fast.rope")
    dims = int(seen["dims"])
    if dims <= 0 or dims % 2 or dims > head_dim or (seen["base"] is None) == (seen["freqs"] is None):
        raise Unsupported(f"{where}: RoPE arguments the kernel does not cover")
    return {"dims": dims, "traditional": bool(seen["traditional"]),
            "base": None if seen["base"] is None else float(seen["base"]),
            "scale": float(seen["scale"]), "freqs": seen["freqs"]}
