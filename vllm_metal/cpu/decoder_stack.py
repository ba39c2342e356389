"""Run a decoder stack as one CPU graph node (``decoder_stack``).

On MLX's CPU backend the host thread spends ~10 us enqueueing each graph node
and a 30-layer decode step built module by module is ~900 nodes, so the step
is bound by enqueueing rather than arithmetic. The op runs a stack of blocks of
this shape in one node: attention (separate or fused q/k/v, q/k RMSNorm per head
or across heads, RoPE or none, window, softcap) and a gated MLP (SiLU or GELU),
each with an RMSNorm before and/or after it, residuals optionally scaled, then the
final norm. ``plan_decoder_stack`` reads a family's layers for those parts (by the
attribute names mlx-lm's families use), and keeps the plan only if one probe step
through it equals the module path's: a family whose block does anything else
(parallel residuals, other activations, extra arguments) fails the probe and keeps
the module path. Only for float32 activations (the caches may be float32, float16
or bfloat16). Linears wrapped for LoRA adapters are read through to their base
weights; the stack adds each step's updates itself (vllm_metal.cpu.stack_lora). A
tensor rank gathering its output projections' inputs (vllm_metal.distributed.tensor)
runs the stack in segments, two a layer, with the gathers between them.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context
from vllm_metal.cpu.fast_experts import FAST_EXPERT_CLASSES
from vllm_metal.cpu.fast_linears import FastLinear, FastQuantizedLinear, tile_int8_weights
from vllm_metal.cpu.stack_lora import Site, StackLoRA
from vllm_metal.distributed.pipeline import link_of
from vllm_metal.distributed.tensor import GatheredToAll
from vllm_metal.lora.layer import LoRALinear
from vllm_metal.models.adapter import ModelAdapter
from vllm_metal.native import get_ops
from vllm_metal.ops.linear import tile_quantized, untile_quantized

logger = logging.getLogger("vllm_metal")


class Unsupported(Exception):
    """Why a model keeps the module path (logged once at load)."""


# The stack computes in fp32 and rounds keys and values to the cache's dtype.
_CACHE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

# StackNorms bits (csrc/cpu/decoder_stack/decoder_stack_cpu.h).
_PRE_ATTN, _POST_ATTN, _PRE_MLP, _POST_MLP = 1, 2, 4, 8
_SILU, _GELU_TANH, _GELU, _SWIGLU_OAI = 0, 1, 2, 3
# csrc/cpu/decoder_stack/decoder_stack_cpu.h's SwigluOai constants (gpt-oss's).
_SWIGLU_OAI_ALPHA, _SWIGLU_OAI_LIMIT = 1.702, 7.0
_QK_NONE, _QK_PER_HEAD, _QK_ACROSS = 0, 1, 2
# StackAt: the points a segment of the stack starts or ends at.
_BEFORE_O, _BEFORE_DOWN = 1, 2

# Where families keep each norm: (norms mask, attribute per slot in the order
# pre-attention, post-attention, pre-MLP, post-MLP). llama's post_attention_layernorm
# is its pre-MLP norm; Gemma's and OLMo's norms the attention output.
_LAYOUTS = (
    (_PRE_ATTN | _PRE_MLP, ("input_layernorm", None, "post_attention_layernorm", None)),
    (_PRE_ATTN | _POST_ATTN | _PRE_MLP | _POST_MLP,
     ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
      "post_feedforward_layernorm")),
    (_PRE_ATTN | _POST_ATTN | _PRE_MLP | _POST_MLP,
     ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
      "post_mlp_layernorm")),
    (_POST_ATTN | _POST_MLP, (None, "post_attention_layernorm", None,
                              "post_feedforward_layernorm")),
)
# Where families keep a layer's MLP (Mixtral and PhiMoE: block_sparse_moe).
_MLP_NAMES = ("mlp", "block_sparse_moe")
# MoE routings the stack computes (cpu/decoder_stack/moe_block.h MoeScoring,
# normalize): softmax over the experts then top-k, with or without renormalising
# the k weights (Qwen2/3-MoE, OLMoE), softmax over the top-k logits (Mixtral),
# and sigmoid scores chosen with a correction bias among the best expert groups
# (DeepSeek-V3's "noaux_tc": GLM-4 MoE, dots1). Which one a family does is found
# by the probe, as the norm layout is.
_SOFTMAX, _SOFTMAX_OF_TOP_K, _SIGMOID = 0, 1, 2
_ROUTINGS = ((_SOFTMAX, False), (_SOFTMAX, True), (_SOFTMAX_OF_TOP_K, False),
             (_SIGMOID, False), (_SIGMOID, True))
# Attributes a MoE block keeps its top-k in, and its router under.
_TOP_K_NAMES = ("num_experts_per_tok", "top_k", "k")
_ROUTER_NAMES = ("gate", "router")
# A router module wrapping its linear (Granite-MoE's `layer`, AFMoE's `gate`).
_ROUTER_LINEARS = ("layer", "gate")
# Where families keep the selection bias, group counts and weight scale of sigmoid
# routing, on the router or on the MoE block.
_CORRECTION_NAMES = ("e_score_correction_bias", "expert_bias")
_SCALE_NAMES = ("routed_scaling_factor", "route_scale")

# One probe step through both paths must agree this closely (fp32, our kernels on
# both sides; only summation order and the activations' approximations differ).
_PROBE_RTOL = 1e-3
_PROBE_BLOCK = 16


@dataclass
class DecoderStackPlan:
    """The model's decoder weights as the extension holds them (built once).

    ``embed_scale``: what the backbone multiplies the embeddings by before its
    first layer (Gemma's sqrt(hidden), Granite's multiplier; None: nothing).
    """

    weights: object   # vllm_metal._ext.DecoderStackWeights
    embed_scale: float | None = None
    layout: str = ""
    lora: StackLoRA | None = None   # the LoRA layers' sites (--enable-lora)
    # Tensor parallel: each layer's gathered (o, down); the stack then runs as segments
    # between the gathers.
    gathers: list[tuple[GatheredToAll, GatheredToAll]] | None = None

    def __call__(self, x: mx.array, ctx: ForwardContext, embedded: bool = True) -> mx.array:
        """x float32 [1, T, hidden] embeddings (embedded) or a previous pipeline stage's
        hidden states -> [1, T, hidden] after the layers and the final norm (a stage
        before the last has none: its residual stream).

        The op writes ctx's caches in place when it runs (they stay the same
        arrays); later readers are enqueued after it on the same stream.
        """
        if embedded and self.embed_scale is not None:
            x = x * self.embed_scale
        meta = ctx.metadata
        groups = [ctx.group_of(layer) for layer in range(len(ctx.key_caches))]
        step = (ctx.key_caches, ctx.value_caches, meta.positions, meta.slot_mapping,
                meta.block_tables, meta.seq_lens, meta.cu_seqlens_q, groups)
        options = {"kv_quant": 0 if ctx.kv_quant is None else ctx.kv_quant.code,
                   "key_columns": ctx.key_columns, "rope_angles": meta.rope_angles,
                   "key_ends": meta.key_ends}
        if self.gathers is not None:
            return self._segments(x, step, options)
        lora = self.lora.step(self.weights) if self.lora is not None else None
        return get_ops().decoder_stack(self.weights, x, *step, *(lora or ()), **options)[0]

    def _segments(self, x: mx.array, step: tuple, options: dict) -> mx.array:
        """The stack in segments from each output projection's input to the next's,
        each input gathered from every rank's slice between them."""
        stack = get_ops().decoder_stack
        begin, carry = (0, 0), None
        for layer, pair in enumerate(self.gathers):
            for at, gathered in zip((_BEFORE_O, _BEFORE_DOWN), pair):
                x, part = stack(self.weights, x, *step, begin=begin, end=(layer, at),
                                carry=carry, **options)
                carry, begin = gathered.gather(part), (layer, at)
        return stack(self.weights, x, *step, begin=begin, carry=carry, **options)[0]

    def accepts(self, x: mx.array, ctx: ForwardContext) -> bool:
        return x.dtype == mx.float32 and (ctx.kv_quant is not None
                                          or ctx.key_caches[0].dtype in _CACHE_DTYPES)


def plan_decoder_stack(adapter: ModelAdapter,
                       int8_activations: bool = False) -> DecoderStackPlan | None:
    """The stack's plan, or None (logged) when no plan reproduces the module path.

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
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise Unsupported(f"{_qualname(backbone)} has no list of layers")
    if getattr(backbone, "pipeline_size", 1) != 1:
        raise Unsupported("mlx-lm's own pipeline split")
    if adapter.tensor is not None and not adapter.tensor.gather:
        raise Unsupported("a tensor-parallel shard summing partial products (the stack has "
                          "no all-sum inside a layer; VLLM_METAL_TP_GATHER=1 gathers)")
    stage = adapter.stage
    if stage is not None:   # a pipeline stage runs its own layers
        layers = layers[stage.start:stage.end]
    if len(adapter.entries) != len(layers):
        raise Unsupported("layers share KV entries")
    if any(e.state is not None for e in adapter.entries):
        raise Unsupported("linear-attention layers keep a recurrent state, not K/V")
    if not hasattr(backbone, "embed_tokens"):
        raise Unsupported(f"{_qualname(backbone)} has no embed_tokens")
    final = None
    if stage is None or stage.is_last:
        final = _norm_weight(getattr(backbone, "norm", None), "final norm")
    try:
        probe = _Probe(adapter, layers)
        embed_scale = probe.embed_scale()
    except Unsupported:
        raise
    except Exception as e:  # the module path itself is what serves then
        raise Unsupported(f"the probe step failed ({type(e).__name__}: {e})") from e
    tried = []
    routings = _ROUTINGS if any(_experts_of(layer) for layer in layers) else (None,)
    for (norms, names), routing in itertools.product(_LAYOUTS, routings):
        if not all(n is None or hasattr(layer, n) for layer in layers for n in names):
            continue
        # Verified in fp32 arithmetic on both sides (int8-rounded activations would
        # land on other steps at rounding edges and blur the comparison); the plan
        # kept has the same layout (and MoE routing).
        layout = _layout_name(names) + (f" ({_routing_name(routing)})" if routing else "")
        try:
            plan = _build(adapter, layers, norms, names, final, embed_scale, False, routing)
            error = probe.error(plan)
        except (ValueError, RuntimeError) as e:  # the extension refused the spec or step
            tried.append(f"{layout}: {e}")
            continue
        if error <= _PROBE_RTOL:
            if int8_activations:
                # In place, so the stack and the module path share one copy.
                tile_int8_weights(adapter.backbone)
                plan = _build(adapter, layers, norms, names, final, embed_scale, True, routing)
            return plan
        tried.append(f"{layout}: off by {error:.2g}")
    if not tried:
        raise Unsupported(f"{_qualname(layers[0])} has none of the norm layouts the stack runs")
    raise Unsupported(f"{_qualname(layers[0])} is not computed by any stack layout "
                      f"({'; '.join(tried)})")


def _build(adapter: ModelAdapter, layers: list, norms: int, names: tuple,
           final: tuple | None, embed_scale: float | None, int8_activations: bool,
           routing: tuple[int, bool] | None = None) -> DecoderStackPlan:
    """``layers``: the ones this process runs (adapter.entries[i] is layers[i]'s);
    ``final``: the final norm's (weight, eps), None on a pipeline stage before the last."""
    arrays: list[mx.array] = []
    ints: list[int] = []
    floats: list[float] = []
    heads: set[tuple[int, int, int]] = set()
    sites: list[Site] = []
    bank = None
    moe_layers: list[int] = []
    moe: list[object] = []
    gathers: list[tuple[GatheredToAll, GatheredToAll]] = []
    hidden = adapter.hidden_size
    for index, layer in enumerate(layers):
        where = f"layer {adapter.held[index]}"
        facts = adapter.entries[index]
        heads.add((facts.num_heads, facts.num_kv_heads, facts.head_dim))
        inner = getattr(layer, "self_attn", None)
        if inner is None:
            raise Unsupported(f"{where} has no self_attn")
        inner = getattr(inner, "inner", inner)  # PagedAttention wraps Gemma 2's own
        sinks = _sinks(inner, facts, where)
        q_rows = facts.num_heads * facts.head_dim
        kv_rows = facts.num_kv_heads * facts.head_dim
        attn = _projections(inner, ("q_proj", "k_proj", "v_proj"), "qkv_proj",
                            (q_rows, kv_rows, kv_rows), where)
        mlp = next((getattr(layer, n) for n in _MLP_NAMES if hasattr(layer, n)), None)
        if mlp is None:
            raise Unsupported(f"{where} has no mlp")
        switch = _experts_of(layer)
        if switch is not None:
            if routing is None:
                raise Unsupported(f"{where}: a mixture-of-experts MLP needs a routing")
            mlp_linears = []
            activation = _expert_activation(switch, where)
            moe_layers.append(index)
            moe.append(_moe(mlp, switch, routing, hidden, int8_activations, where))
        else:
            fused = "gate_up_proj" if hasattr(mlp, "gate_up_proj") else ""
            half = _Rows.of(mlp.gate_up_proj, where).n // 2 if fused else 0
            mlp_linears = [*_projections(mlp, ("gate_proj", "up_proj"), fused,
                                         (half, half) if fused else (), where)]
        o = _attr(inner, "o_proj", where)
        down = None if switch is not None else _attr(mlp, "down_proj", where)
        if isinstance(o, GatheredToAll) and isinstance(down, GatheredToAll):
            gathers.append((o, down))   # each runs whole on the gathered input
            o, down = o.inner, down.inner
        if down is not None:
            mlp_linears.append(_Rows.of(down, where))
        linears = [lin.laid_out(int8_activations) for lin in
                   (*attn, _Rows.of(o, where), *mlp_linears)]
        for projection, lin in enumerate(linears):
            ints += lin.spec()
            if lin.lora is not None:
                sites.append(Site(index, projection, lin.lora._lora_name, lin.lora_col0))
                bank = lin.lora._lora_bank
        if switch is not None:
            ints += [-1, 0, 0, 0] * 3
        qk, qk_eps, qk_arrays = _qk_norms(inner, facts, where)
        rope = _rope_spec(getattr(inner, "rope", None), facts.head_dim, where)
        if switch is None:
            activation = _activation(mlp, where)
        ints += [qk, rope["dims"], int(rope["traditional"]), int(rope["freqs"] is not None),
                 int(facts.window or 0), norms, activation, int(sinks is not None)]
        slot = [_norm_weight(getattr(layer, n), f"{where} {n}") if n else None for n in names]
        eps = [w[1] if w else 0.0 for w in slot]
        floats += [eps[0], eps[2], qk_eps, rope["base"] or 0.0, rope["scale"], facts.scale,
                   facts.softcap or 0.0, eps[1], eps[3], _residual_scale(layer)]
        if slot[0]:
            arrays.append(slot[0][0])
        for lin in linears[:4]:
            arrays += lin.arrays
        arrays += qk_arrays
        for w in slot[1:3]:
            if w:
                arrays.append(w[0])
        for lin in linears[4:]:
            arrays += lin.arrays
        if slot[3]:
            arrays.append(slot[3][0])
        if rope["freqs"] is not None:
            arrays.append(rope["freqs"].astype(mx.float32))
        if sinks is not None:
            arrays.append(sinks)
    if len(heads) != 1:
        raise Unsupported("layers differ in head counts or head size")
    (num_heads, num_kv_heads, head_dim), = heads
    if gathers and len(gathers) != len(layers):
        raise Unsupported("some layers' output projections are gathered, others not")
    final_norm, final_eps = final or (mx.zeros((0,), dtype=mx.float32), 0.0)
    return DecoderStackPlan(get_ops().DecoderStackWeights(
        arrays, ints, floats, final_norm, final_eps, hidden, num_heads, num_kv_heads, head_dim,
        int8_activations, moe_layers, moe, bool(gathers)), embed_scale,
        _layout_name(names) + (f" ({_routing_name(routing)})" if moe else ""),
        StackLoRA(bank, sites) if sites else None, gathers or None)


def _sinks(inner: nn.Module, facts, where: str) -> mx.array | None:
    """float32 [num_heads]: the per-head sink logits the layer attends with (its
    ``sinks``, as gpt-oss passes them to the attention), or None; the probe step checks
    that this is what the module adds."""
    if not facts.has_sinks:
        return None
    sinks = getattr(inner, "sinks", None)
    if not isinstance(sinks, mx.array) or sinks.shape != (facts.num_heads,):
        raise Unsupported(f"{where} attends with sinks that are not its [heads] `sinks`")
    return sinks.astype(mx.float32)


def _layout_name(names: tuple) -> str:
    return "+".join(n for n in names if n)


def _qualname(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__name__}"


def _attr(module: nn.Module, name: str, where: str) -> nn.Module:
    found = getattr(module, name, None)
    if found is None:
        raise Unsupported(f"{where}: {type(module).__name__} has no {name}")
    return found


def _projections(module: nn.Module, names: tuple, fused: str, rows: tuple,
                 where: str) -> list[_Rows]:
    """The separate linears ``names`` of ``module``, or its ``fused`` linear cut into
    ``rows`` output rows each (quantized rows are whole rows: a cut keeps its groups)."""
    if all(hasattr(module, n) for n in names):
        return [_Rows.of(getattr(module, n), where) for n in names]
    if fused and hasattr(module, fused):
        whole = _Rows.of(getattr(module, fused), where).laid_out(False)  # once, for the cuts
        if sum(rows) != whole.n:
            raise Unsupported(f"{where}: {fused} has {whole.n} rows, expected {sum(rows)}")
        cuts, start = [], 0
        for r in rows:
            cuts.append(whole.slice(start, start + r))
            start += r
        return cuts
    raise Unsupported(f"{where}: {type(module).__name__} has neither {', '.join(names)}"
                      + (f" nor {fused}" if fused else ""))


@dataclass
class _Rows:
    """A linear as the stack takes it: bits/group size and its arrays (weight [+ scales,
    biases] [+ bias]), possibly a block of a fused linear's output rows; for a LoRA
    layer, its base's, with the layer and the first of its outputs (a column of the
    adapters' B) this block is."""

    bits: int
    group_size: int
    weight: mx.array
    scales: mx.array | None
    biases: mx.array | None
    bias: mx.array | None
    lora: LoRALinear | None = None
    lora_col0: int = 0
    tiled: bool = False  # quantized arrays in tile_quantized's order
    zero_point: int = 0  # the module's (fast_linears._find_zero_point), 0 if affine

    @classmethod
    def of(cls, lin: nn.Module, where: str) -> _Rows:
        lora = lin if isinstance(lin, LoRALinear) else None
        if lora is not None:
            lin = lora.base
        bias = lin["bias"] if "bias" in lin else None
        if type(lin) is FastQuantizedLinear:
            return cls(lin.bits, lin.group_size, lin.weight, lin.scales, lin.biases, bias, lora,
                       tiled=lin.tiled, zero_point=lin.zero_point or 0)
        if type(lin) is FastLinear:
            return cls(0, 0, lin.weight, None, None, bias, lora)
        raise Unsupported(f"{where} has a {type(lin).__name__} the CPU kernels do not cover")

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    def slice(self, start: int, stop: int) -> _Rows:
        """Rows [start, stop), in MLX's layout (a tile need not start at the cut)."""
        whole = self.laid_out(False)
        cut = lambda a: None if a is None else a[start:stop]  # noqa: E731
        return _Rows(self.bits, self.group_size, cut(whole.weight), cut(whole.scales),
                     cut(whole.biases), cut(self.bias), self.lora, self.lora_col0 + start,
                     zero_point=self.zero_point)

    def laid_out(self, tiled: bool) -> _Rows:
        """These rows with quantized arrays in tile order (``tiled``) or MLX's: the
        stack reads a quantized linear tiled exactly when it runs int8 activations."""
        if not self.bits or self.tiled == tiled:
            return self
        change = tile_quantized if tiled else untile_quantized
        weight, scales, biases = change(self.weight, self.scales, self.biases)
        return replace(self, weight=weight, scales=scales, biases=biases, tiled=tiled)

    @property
    def formed_zero(self) -> int:
        """The zero point the stack forms biases from (-zero * scale) instead of
        reading them: symmetric weights laid out for int8 activations (the int8
        kernels form biases; the float ones read them), else 0."""
        return self.zero_point if self.tiled else 0

    def spec(self) -> list[int]:
        """stack_spec::kLinearInts: bits, group_size, has_bias, zero_point."""
        return [self.bits, self.group_size, int(self.bias is not None), self.formed_zero]

    @property
    def arrays(self) -> list[mx.array]:
        biases = None if self.formed_zero else self.biases
        return [a for a in (self.weight, self.scales, biases, self.bias) if a is not None]


def _routing_name(routing: tuple[int, bool]) -> str:
    scoring, normalize = routing
    if scoring == _SOFTMAX_OF_TOP_K:
        return "softmax of the top-k logits"
    kind = "sigmoid, grouped top-k" if scoring == _SIGMOID else "softmax, top-k"
    return kind + (", renormalised" if normalize else "")


def _router_rows(router: nn.Module, where: str) -> _Rows:
    """A router as the stack takes it: a linear, a module wrapping one, or a gate holding
    its weight [E, hidden] itself (DeepSeek-V3-style MoEGate: x @ weight.T)."""
    inner = next((getattr(router, n) for n in _ROUTER_LINEARS
                  if type(getattr(router, n, None)) in (FastLinear, FastQuantizedLinear)), None)
    if inner is not None and "weight" not in router:
        return _Rows.of(inner, where)
    weight = getattr(router, "weight", None)
    if (type(router) not in (FastLinear, FastQuantizedLinear) and isinstance(weight, mx.array)
            and weight.ndim == 2 and "scales" not in router):
        return _Rows(0, 0, weight, None, None, None)
    return _Rows.of(router, where)


def _experts_of(layer: nn.Module) -> nn.Module | None:
    """The layer's expert MLP (mlx-lm's SwitchGLU: gate/up/down expert layers switched
    to vllm-metal's expert matmul), or None for a dense MLP."""
    mlp = next((getattr(layer, n) for n in _MLP_NAMES if hasattr(layer, n)), None)
    for name in ("switch_mlp", "experts"):
        switch = getattr(mlp, name, None)
        if switch is not None and all(type(getattr(switch, p, None)) in FAST_EXPERT_CLASSES
                                      for p in ("gate_proj", "up_proj", "down_proj")):
            return switch
    return None


def _expert_activation(switch: nn.Module, where: str) -> int:
    from mlx_lm.models.switch_layers import SwiGLU

    from mlx_lm.models.activations import SwigluOAI

    activation = getattr(switch, "activation", None)
    if type(activation) is SwiGLU:
        return _SILU
    if (type(activation) is SwigluOAI and activation._alpha == _SWIGLU_OAI_ALPHA
            and activation._limit == _SWIGLU_OAI_LIMIT):
        return _SWIGLU_OAI
    raise Unsupported(f"{where}: experts with an activation other than SwiGLU or gpt-oss's")


def _expert_arrays(layer: nn.Module, int8_activations: bool
                   ) -> tuple[list[mx.array], tuple[int, int, int, int]]:
    """(arrays, (bits, group_size, mxfp4, has_bias)) of one expert projection; affine
    arrays tiled exactly when the stack runs int8 activations."""
    bias = layer["bias"] if "bias" in layer else None
    if hasattr(layer, "scales"):
        mxfp4 = layer.mode == "mxfp4"
        arrays = [layer.weight, layer.scales] + ([] if mxfp4 else [layer.biases])
        tiled = getattr(layer, "tiled", False)
        if not mxfp4 and tiled != int8_activations:
            arrays = list((tile_quantized if int8_activations else untile_quantized)(*arrays))
        spec = (layer.bits, layer.group_size, int(mxfp4))
    else:
        arrays, spec = [layer.weight], (0, 0, 0)
    return arrays + ([bias] if bias is not None else []), (*spec, int(bias is not None))


def _moe(block: nn.Module, switch: nn.Module, routing: tuple[int, bool], hidden: int,
         int8_activations: bool, where: str) -> object:
    """The layer's DecoderStackMoe (csrc/ops/decoder_stack_moe.h)."""
    router = next((getattr(block, n) for n in _ROUTER_NAMES if hasattr(block, n)), None)
    top_k = next((getattr(owner, n) for owner in (block, router) for n in _TOP_K_NAMES
                  if isinstance(getattr(owner, n, None), int)), None)
    if router is None or top_k is None:
        raise Unsupported(f"{where}: {type(block).__name__} has no router or top-k the stack reads")
    router_rows = _router_rows(router, where).laid_out(int8_activations)
    arrays = list(router_rows.arrays)
    specs = []
    for name in ("gate_proj", "up_proj", "down_proj"):
        got, spec = _expert_arrays(getattr(switch, name), int8_activations)
        arrays += got
        specs.append(spec)
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    shared_gate = getattr(block, "shared_expert_gate", None) if shared is not None else None
    shared_specs = [0, 0, 0, 0] * 3
    gate_spec = [0, 0, 0, 0]
    if shared is not None:
        shared_rows = [_Rows.of(_attr(shared, n, where), where).laid_out(int8_activations)
                       for n in ("gate_proj", "up_proj", "down_proj")]
        shared_specs = [v for r in shared_rows for v in r.spec()]
        arrays += [a for r in shared_rows for a in r.arrays]
    if shared_gate is not None:
        gate_rows = _Rows.of(shared_gate, where).laid_out(int8_activations)
        gate_spec = gate_rows.spec()
        arrays += gate_rows.arrays
    scoring, normalize = routing
    groups = [0, 1, 1]
    if scoring == _SIGMOID:
        correction = _found((router, block), _CORRECTION_NAMES)
        if correction is not None:
            arrays.append(correction.astype(mx.float32))
        groups = [int(correction is not None), int(_found((router, block), ("n_group",)) or 1),
                  int(_found((router, block), ("topk_group",)) or 1)]
    ints = [int(top_k), scoring, int(normalize), int(shared is not None),
            int(shared_gate is not None), *router_rows.spec(), *(v for s in specs for v in s),
            *shared_specs,
            *gate_spec, *groups]
    scale = _found((block, router), _SCALE_NAMES)
    return get_ops().DecoderStackMoe(arrays, ints, 1.0 if scale is None else float(scale),
                                     hidden, int8_activations)


def _found(owners: tuple, names: tuple):
    """The first of ``names`` set (not None) on the first owner that has it."""
    return next((getattr(o, n) for o in owners for n in names
                 if getattr(o, n, None) is not None), None)


def _norm_weight(module: nn.Module | None, where: str) -> tuple[mx.array, float]:
    """(w, eps) with ``module(x) == rms_norm(x, w, eps)``: nn.RMSNorm's own weight, or
    1 + weight for Gemma-style norms; found by running the module once."""
    weight, eps = getattr(module, "weight", None), getattr(module, "eps", None)
    if module is None or weight is None or eps is None or weight.ndim != 1:
        raise Unsupported(f"{where} is a {type(module).__name__}, not an RMSNorm")
    x = mx.random.normal((3, weight.shape[0]), key=mx.random.key(0))
    got = module(x).astype(mx.float32)
    for w in (weight, 1.0 + weight.astype(mx.float32)):
        want = mx.fast.rms_norm(x, w.astype(mx.float32), eps)
        if mx.allclose(got, want, rtol=1e-5, atol=1e-6).item():
            return w, float(eps)
    raise Unsupported(f"{where} ({type(module).__name__}) is not an RMSNorm of its weight")


def _qk_norms(inner: nn.Module, facts, where: str) -> tuple[int, float, list[mx.array]]:
    if not hasattr(inner, "q_norm") and not hasattr(inner, "k_norm"):
        return _QK_NONE, 0.0, []
    q, q_eps = _norm_weight(getattr(inner, "q_norm", None), f"{where} q_norm")
    k, k_eps = _norm_weight(getattr(inner, "k_norm", None), f"{where} k_norm")
    if q_eps != k_eps:
        raise Unsupported(f"{where}: q_norm and k_norm have different eps")
    if q.shape[0] == facts.head_dim and k.shape[0] == facts.head_dim:
        return _QK_PER_HEAD, q_eps, [q, k]
    if (q.shape[0] == facts.num_heads * facts.head_dim
            and k.shape[0] == facts.num_kv_heads * facts.head_dim):
        return _QK_ACROSS, q_eps, [q, k]
    raise Unsupported(f"{where}: q/k norms of sizes {q.shape[0]}, {k.shape[0]}")


def _activation(mlp: nn.Module, where: str) -> int:
    """Which gated activation ``mlp`` computes, found by running it once against its
    own linears (so int8-rounded inputs round alike on both sides)."""
    down = _attr(mlp, "down_proj", where)
    if hasattr(mlp, "gate_up_proj"):
        fused = mlp.gate_up_proj
        halves = lambda x: mx.split(fused(x), 2, axis=-1)  # noqa: E731
    else:
        gate, up = _attr(mlp, "gate_proj", where), _attr(mlp, "up_proj", where)
        halves = lambda x: (gate(x), up(x))  # noqa: E731
    k = _Rows.of(down.inner if isinstance(down, GatheredToAll) else down, where).n
    x = mx.random.normal((2, k), key=mx.random.key(1))
    try:
        got = mlp(x)
        g, u = halves(x)
    except Exception as e:
        raise Unsupported(f"{where}: {type(mlp).__name__} failed a probe ({e})") from e
    for kind, act in ((_SILU, nn.silu), (_GELU_TANH, nn.gelu_approx), (_GELU, nn.gelu)):
        want = down(act(g) * u)
        if mx.allclose(got, want, rtol=1e-4, atol=1e-5 * float(mx.abs(want).max())).item():
            return kind
    raise Unsupported(f"{where}: {type(mlp).__name__} is not a SiLU or GELU gated MLP")


def _residual_scale(layer: nn.Module) -> float:
    """Granite's residual_multiplier, MiniCPM's scale_depth / sqrt(layers), else 1."""
    if hasattr(layer, "residual_multiplier"):
        return float(layer.residual_multiplier)
    if hasattr(layer, "scale_depth") and hasattr(layer, "num_hidden_layers"):
        return float(layer.scale_depth) / math.sqrt(layer.num_hidden_layers)
    return 1.0


class _Probe:
    """One small step through the module path, and through a candidate plan on fresh
    caches: how far apart they land."""

    def __init__(self, adapter: ModelAdapter, layers: list):
        """``layers``: the ones the stack would run (a pipeline stage's)."""
        self.adapter = adapter
        self.layers = layers
        entry = adapter.entries[0]
        # Three sequences: 6 new tokens; 3 new after 40 cached (zeros), crossing small
        # windows; 4 at positions near 70000 (rotations and position-dependent scales
        # far out; attention sees only these 4).
        self.kv_shape = (7, _PROBE_BLOCK, entry.num_kv_heads, entry.head_dim)
        far = 70_001
        positions = [*range(6), *range(40, 43), *range(far, far + 4)]
        slots = [_PROBE_BLOCK + p for p in range(6)]
        slots += [2 * _PROBE_BLOCK + p for p in range(40, 43)]
        slots += [5 * _PROBE_BLOCK + p for p in range(4)]
        table = [[1, 0, 0], [2, 3, 4], [5, 0, 0]]
        i32 = lambda v: mx.array(v, dtype=mx.int32)  # noqa: E731
        self.meta = AttentionMetadata(i32(positions), i32([0, 6, 9, 13]), i32([6, 43, 4]),
                                      [i32(table)], [i32(slots)])
        self.ids = mx.array([(7 * i + 3) % adapter.vocab_size for i in range(13)],
                            dtype=mx.int32)
        self.first_input: mx.array | None = None
        self.reference = self._module_path()

    def _caches(self) -> list[mx.array]:
        return [mx.zeros(self.kv_shape) for _ in self.adapter.entries]

    def _module_path(self) -> mx.array:
        from vllm_metal.cpu.fast_functions import fast_functions

        backbone = self.adapter.backbone
        int8 = [m for _, m in backbone.named_modules() if getattr(m, "int8_activations", False)]
        # A stage before the last: what its layers hand on, not the final norm's output.
        link = link_of(backbone.layers) if self.adapter.stage is not None else None
        last = link is None or self.adapter.stage.is_last
        first = self.layers[0]
        block = type(first)
        call = block.__call__
        probe = self

        def tapped(layer, x, *args, **kwargs):  # what the backbone hands its first layer
            if layer is first and probe.first_input is None:
                probe.first_input = x
            return call(layer, x, *args, **kwargs)

        block.__call__ = tapped
        for m in int8:
            m.int8_activations = False
        try:
            ctx = ForwardContext(self.meta, self._caches(), self._caches())
            with forward_context(ctx), fast_functions():
                out = self.adapter.hidden(self.ids)
            if not last:
                out = link.outgoing.reshape(out.shape)
            mx.eval(out, self.first_input)
        finally:
            block.__call__ = call
            for m in int8:
                m.int8_activations = True
            if link is not None:
                link.clear()
        return out

    def embed_scale(self) -> float | None:
        """The one factor between the embeddings and the first layer's input."""
        embedded = self.adapter.backbone.embed_tokens(self.ids)
        seen = self.first_input.reshape(embedded.shape).astype(mx.float32)
        big = mx.abs(embedded) > 1e-3 * mx.abs(embedded).max()
        ratio = float((mx.sum(mx.where(big, seen / mx.where(big, embedded, 1), 0))
                       / mx.maximum(big.sum(), 1)).item())
        if not mx.allclose(seen, embedded * ratio, rtol=1e-5, atol=1e-6).item():
            raise Unsupported("the backbone's first layer sees more than scaled embeddings")
        return None if ratio == 1.0 else ratio

    def error(self, plan: DecoderStackPlan) -> float:
        """max |stack - module path| / max |module path| on the probe."""
        ctx = ForwardContext(self.meta, self._caches(), self._caches())
        x = self.adapter.backbone.embed_tokens(self.ids[None])
        out = plan(x.astype(mx.float32), ctx)[0]
        scale = max(float(mx.abs(self.reference).max()), 1e-6)
        return float(mx.abs(out - self.reference).max()) / scale


_NO_ROPE = {"dims": 0, "traditional": False, "base": None, "scale": 1.0, "freqs": None}


def _rope_spec(rope: nn.Module | None, head_dim: int, where: str) -> dict:
    """Learn what the RoPE module asks mx.fast.rope for, by calling it once.

    The module must hand its input and offset to mx.fast.rope unchanged and
    return the result unchanged (no pre-scaling as in YaRN), else Unsupported.
    No module, or one that returns its input untouched (SmolLM3's NoPE layers):
    no rotation.
    """
    if rope is None:
        return _NO_ROPE
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
    if result is probe and not seen:
        return _NO_ROPE
    if (result is not marker or seen.get("a") is not probe or seen.get("offset") is not offset
            or seen.get("stream") is not None):
        raise Unsupported(f"{where}: RoPE {type(rope).__name__} does more than mx.fast.rope")
    dims = int(seen["dims"])
    if (dims <= 0 or dims % 2 or dims > head_dim
            or (seen["base"] is None) == (seen["freqs"] is None)):
        raise Unsupported(f"{where}: RoPE arguments the kernel does not cover")
    return {"dims": dims, "traditional": bool(seen["traditional"]),
            "base": None if seen["base"] is None else float(seen["base"]),
            "scale": float(seen["scale"]), "freqs": seen["freqs"]}
