"""The one-node decoder stack against the module-by-module forward of the same
model (mlx-lm's own layer code over our paged ops), step by step, and which
models it takes."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

from tests.tiny_models import cached_tiny_model
from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.cpu.decoder_stack import (
    _LAYOUTS, Unsupported, _build, _layout_name, _norm_weight, _Probe, plan_decoder_stack,
)
from vllm_metal.cpu.fast_linears import _find_zero_point
from vllm_metal.distributed.tensor import TensorShard
from vllm_metal.native import get_ops
from vllm_metal.ops.reference import key_columns_as_rows
from vllm_metal.v1.model_lifecycle import load_model

pytestmark = pytest.mark.usefixtures("exact_arithmetic")

BLOCK = 16


def load_cpu(path: str):
    return load_model(path, mx.float32, CpuBackend())


def module_path(loaded):
    """The same loaded model, run module by module (no one-node stack)."""
    return dataclasses.replace(loaded, backbone=dataclasses.replace(loaded.backbone, stack=None))


def _meta(seqs: list[tuple[int, int, int]]) -> AttentionMetadata:
    """seqs: (first block id, tokens already cached, new tokens) per sequence."""
    positions, slots, cu, lens, tables = [], [], [0], [], []
    for block, cached, new in seqs:
        pos = list(range(cached, cached + new))
        positions += pos
        slots += [block * BLOCK + p for p in pos]   # each sequence owns one block
        cu.append(cu[-1] + new)
        lens.append(cached + new)
        tables.append([block])
    i32 = lambda v: mx.array(v, dtype=mx.int32)  # noqa: E731
    return AttentionMetadata(i32(positions), i32(cu), i32(lens), [i32(tables)], [i32(slots)])


def _run(loaded, steps, seed: int, cache_dtype=mx.float32, key_columns=False, dress=None):
    """Each step's hidden states and the caches after the last; dress(i, meta): what
    step i's metadata adds (given rotary angles, key ends)."""
    d = loaded.dims
    shape = (4, BLOCK, d.num_kv_heads, d.head_dim)
    key_shape = (4, d.num_kv_heads, d.head_dim, BLOCK) if key_columns else shape
    kc = [mx.zeros(key_shape, dtype=cache_dtype) for _ in range(d.num_layers)]
    vc = [mx.zeros(shape, dtype=cache_dtype) for _ in range(d.num_layers)]
    rng = np.random.default_rng(seed)
    outs = []
    for i, seqs in enumerate(steps):
        meta = _meta(seqs)
        if dress is not None:
            dress(i, meta)
        ids = mx.array(rng.integers(0, d.vocab_size, (1, int(meta.positions.shape[0]))),
                       dtype=mx.int32)
        ctx = ForwardContext(meta, kc, vc, key_columns=key_columns)
        with forward_context(ctx):
            h = loaded.backbone(ids)
        mx.eval(h, ctx.key_caches, ctx.value_caches)
        kc, vc = ctx.key_caches, ctx.value_caches
        outs.append(np.array(h))
    if key_columns:
        kc = [key_columns_as_rows(k) for k in kc]
    as_np = lambda c: np.array(mx.stack(c).astype(mx.float32))  # noqa: E731
    return outs, as_np(kc), as_np(vc)


# A prefill of 7 and 4 tokens, then one decode step each, then a chunk of 3 next to a decode.
STEPS = [[(0, 0, 7), (1, 0, 4)], [(0, 7, 1), (1, 4, 1)], [(0, 8, 3), (1, 5, 1)]]


@pytest.mark.parametrize("family,kwargs", [
    ("llama", {}),
    ("llama", {"quantize_bits": 4, "group_size": 32}),
    ("mistral", {"quantize_bits": 8, "group_size": 64}),
    ("qwen2", {}),
    ("qwen3", {"quantize_bits": 4, "group_size": 64}),
    ("llama", {"rope_scaling": "llama3"}),
    ("llama", {"rope_scaling": "linear"}),
])
def test_stack_matches_the_module_path(family, kwargs):
    loaded = load_cpu(str(cached_tiny_model(family, **kwargs)))
    assert loaded.backbone.stack is not None, "this model should run as one node"
    modules = module_path(loaded)
    got, got_k, got_v = _run(loaded, STEPS, seed=1)
    want, want_k, want_v = _run(modules, STEPS, seed=1)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got_k, want_k, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(got_v, want_v, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("kwargs,dtype", [({}, mx.float32),
                                          ({"quantize_bits": 4, "group_size": 32}, mx.float16)])
def test_key_columns_in_the_stack_and_the_module_path(kwargs, dtype):
    # The CPU backend's key layout: the stack writes and reads key columns as the
    # per-layer ops do, and both hold the keys the row layout holds.
    loaded = load_cpu(str(cached_tiny_model("llama", **kwargs)))
    got, got_k, got_v = _run(loaded, STEPS, seed=2, cache_dtype=dtype, key_columns=True)
    want, want_k, want_v = _run(module_path(loaded), STEPS, seed=2, cache_dtype=dtype,
                                key_columns=True)
    rows, rows_k, rows_v = _run(loaded, STEPS, seed=2, cache_dtype=dtype)
    for g, w, r in zip(got, want, rows):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got_k, want_k, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(got_v, want_v, rtol=2e-4, atol=2e-5)
    # Across layouts the scores' sums run in another order: a float16 cache may
    # round a later step's key or value to the neighbouring half.
    ulp = 2e-5 if dtype == mx.float32 else 1e-3
    np.testing.assert_allclose(got_k, rows_k, rtol=2e-4, atol=ulp)
    np.testing.assert_allclose(got_v, rows_v, rtol=2e-4, atol=ulp)


def test_yarn_with_prescaled_input_keeps_the_module_path():
    # YaRN multiplies q/k before mx.fast.rope: the probe sees that and declines.
    loaded = load_cpu(str(cached_tiny_model("llama", rope_scaling="yarn")))
    rope = loaded.adapter.backbone.layers[0].self_attn.rope
    if getattr(rope, "mscale", 1.0) == 1.0:
        pytest.skip("this YaRN config has no input scale")
    assert loaded.backbone.stack is None


def test_disabled_by_env(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_DECODER_STACK", "0")
    loaded = load_cpu(str(cached_tiny_model("llama")))
    assert loaded.backbone.stack is None


def test_unknown_backbone_is_declined():
    import mlx.nn as nn

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = []

    adapter = load_cpu(str(cached_tiny_model("llama"))).adapter
    adapter.backbone = Other()
    assert plan_decoder_stack(adapter) is None


def test_slot_outside_the_cache_raises_at_evaluation():
    loaded = load_cpu(str(cached_tiny_model("llama")))
    d = loaded.dims
    meta = _meta([(0, 0, 3)])
    meta.slot_mapping = [mx.array([0, 1, 4 * BLOCK], dtype=mx.int32)]   # 4 blocks: 64 slots
    kc = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    vc = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    ctx = ForwardContext(meta, kc, vc)
    with forward_context(ctx), pytest.raises(RuntimeError, match="slot_mapping"):
        mx.eval(loaded.backbone(mx.array([[1, 2, 3]], dtype=mx.int32)))


def test_caches_that_cannot_be_written_in_place_are_refused():
    # The stack writes keys and values into the caches' own buffers: a strided
    # view (here every other block of a larger array) is refused, not copied.
    loaded = load_cpu(str(cached_tiny_model("llama")))
    d = loaded.dims
    meta = _meta([(0, 0, 3)])
    shape = (8, BLOCK, d.num_kv_heads, d.head_dim)
    kc = [mx.zeros(shape)[::2] for _ in range(d.num_layers)]
    vc = [mx.zeros(shape)[::2] for _ in range(d.num_layers)]
    ctx = ForwardContext(meta, kc, vc)
    with forward_context(ctx), pytest.raises((RuntimeError, ValueError), match="row-contiguous"):
        mx.eval(loaded.backbone(mx.array([[1, 2, 3]], dtype=mx.int32)))


def test_weights_with_a_wrong_shape_are_refused_naming_the_layer():
    # The planner's probes, and the extension (which validates every weight once, when
    # the plan is built), name the layer.
    loaded = load_cpu(str(cached_tiny_model("llama")))
    layer = loaded.adapter.backbone.layers[1]
    layer.mlp.down_proj.weight = layer.mlp.down_proj.weight[:, :-1]   # K no longer matches
    backbone = loaded.adapter.backbone
    norms, names = _LAYOUTS[0]
    with pytest.raises((ValueError, Unsupported), match="layer 1"):
        _build(loaded.adapter, backbone.layers, norms, names,
               (backbone.norm.weight, backbone.norm.eps), None, False)


@pytest.mark.parametrize("int8", ["0", "1"])
def test_the_stack_in_segments_computes_the_whole_stacks_bits(int8, monkeypatch):
    # One tensor rank gathering its own slices: every layer's o and down run on their
    # gathered input between segments of the stack (tests/distributed has two ranks).
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", int8)
    path = str(cached_tiny_model("llama", quantize_bits=4, group_size=32))
    whole = load_cpu(path)
    split = load_model(path, mx.float32, CpuBackend(), tensor=TensorShard(0, 1, gather=True))
    assert split.backbone.stack.gathers is not None and split.backbone.stack.weights.gathered
    got, got_k, got_v = _run(split, STEPS, seed=4)
    want, want_k, want_v = _run(whole, STEPS, seed=4)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)


def test_segments_that_do_not_fit_are_refused():
    path = str(cached_tiny_model("llama"))
    split = load_model(path, mx.float32, CpuBackend(), tensor=TensorShard(0, 1, gather=True))
    plain = load_cpu(path)
    d = split.dims
    meta = _meta([(0, 0, 3)])
    caches = lambda: [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim))  # noqa: E731
                      for _ in range(d.num_layers)]
    hidden = split.adapter.hidden_size
    x = mx.zeros((1, 3, hidden))
    width = d.num_heads * d.head_dim

    def segment(weights, begin, end, carry=None):
        return get_ops().decoder_stack(
            weights, x, caches(), caches(), meta.positions, meta.slot_mapping,
            meta.block_tables, meta.seq_lens, meta.cu_seqlens_q, [0] * d.num_layers,
            begin=begin, end=end, carry=carry)

    weights = split.backbone.stack.weights
    h, part = segment(weights, (0, 0), (0, 1))
    assert h.shape == (1, 3, hidden) and part.shape == (1, 3, width)
    cases = [(plain.backbone.stack.weights, (0, 0), (0, 1), None, "gathered"),
             (weights, (0, 1), (0, 2), None, "carry"),
             (weights, (0, 1), (0, 2), mx.zeros((1, 3, width + 1)), "carry must be"),
             (weights, (0, 2), (0, 1), mx.zeros((1, 3, width)), "after begin"),
             (weights, (0, 0), (d.num_layers, 1), None, "layer in"),
             (weights, (0, 0), (0, 0), None, "end")]
    for w, begin, end, carry, message in cases:
        with pytest.raises(ValueError, match=message):
            segment(w, begin, end, carry)


def test_a_stage_before_the_last_hands_on_its_residual_stream():
    # Built without the final norm (a pipeline stage before the last), the stack
    # returns what the final norm would have normalised.
    loaded = load_cpu(str(cached_tiny_model("llama")))
    backbone = loaded.adapter.backbone
    layers, (norms, names) = backbone.layers, _LAYOUTS[0]
    final = (backbone.norm.weight, backbone.norm.eps)
    probe = _Probe(loaded.adapter, layers)
    x = backbone.embed_tokens(probe.ids[None]).astype(mx.float32)

    def run(plan):
        return plan(x, ForwardContext(probe.meta, probe._caches(), probe._caches()))

    whole = run(_build(loaded.adapter, layers, norms, names, final, None, False))
    stream = run(_build(loaded.adapter, layers, norms, names, None, None, False))
    assert not mx.allclose(stream, whole, rtol=1e-2).item()
    normed = mx.fast.rms_norm(stream, final[0], final[1])
    assert mx.allclose(normed, whole, rtol=1e-5, atol=1e-5).item()


@pytest.mark.parametrize("family,kwargs", [
    ("llama", {"quantize_bits": 4, "group_size": 32}),
    ("qwen2", {"quantize_bits": 4, "group_size": 64}),   # q/k/v biases
    ("qwen3", {"quantize_bits": 8, "group_size": 64}),
])
def test_int8_activations_stack_matches_its_module_path_and_stays_near_fp32(
        family, kwargs, monkeypatch):
    path = str(cached_tiny_model(family, **kwargs))
    exact = load_cpu(path)
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "1")
    loaded = load_cpu(path)
    assert loaded.backbone.stack is not None
    modules = module_path(loaded)
    got, got_k, _ = _run(loaded, STEPS, seed=2)
    want, want_k, _ = _run(modules, STEPS, seed=2)
    ref, ref_k, _ = _run(exact, STEPS, seed=2)
    for g, w, r in zip(got, want, ref):
        # Same scheme, both paths: only summation order differs, but a value
        # on a rounding edge may land on the other int8 step, and random
        # weights amplify that from layer to layer (measured: <= 0.8%).
        scale = np.abs(r).max()
        assert np.abs(g - w).max() <= 0.02 * scale
        # Against fp32 activations the rounding shows (measured ~10% of the
        # largest hidden value on these random models; SmolLM2's logits:
        # tests/gguf/test_smollm2_int8.py).
        assert 0 < np.abs(g - r).max() <= 0.25 * scale
    assert np.abs(got_k - want_k).max() <= 0.02 * np.abs(ref_k).max()


@pytest.mark.parametrize("qtype,zero", [("Q4_0", 8), ("Q8_0", 128)])
def test_symmetric_gguf_linears_form_their_biases_in_the_stack(qtype, zero, tmp_path,
                                                                monkeypatch):
    # GGUF's Q4_0 and Q8_0 store W = d * (q - zero): with int8 activations the stack
    # forms each bias from its scale instead of streaming it (a ninth of a 4-bit
    # matrix's bytes). The op-level tests hold the two forms to the same bits
    # (tests/ops/test_linear_q8.py); here the stack must take the form exactly where
    # it applies, and still compute the module path's result.
    from tests.gguf_models import make_family_gguf

    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "1")
    loaded = load_cpu(str(make_family_gguf(tmp_path / "m.gguf", "llama", qtype)))
    layers = loaded.adapter.backbone.layers
    assert loaded.backbone.stack.weights.symmetric_linears == 7 * len(layers)
    got, _, _ = _run(loaded, STEPS, seed=3)
    want, _, _ = _run(module_path(loaded), STEPS, seed=3)
    for g, w in zip(got, want):
        # As the int8 test above: rounding edges, amplified by random weights (up to
        # 2.7% measured on these files, the same whether the stack reads the biases).
        assert np.abs(g - w).max() <= 0.05 * np.abs(w).max()

    # The stack takes the module's mark: one bias off by a step of its dtype, and
    # that linear is not marked, and the stack reads its biases.
    k_proj = layers[0].self_attn.k_proj
    assert k_proj.zero_point == zero
    biases = np.array(k_proj["biases"])
    biases.flat[5] = np.nextafter(biases.flat[5], np.float16(0))
    k_proj["biases"] = mx.array(biases)
    _find_zero_point(k_proj)
    assert k_proj.zero_point is None
    stack = loaded.backbone.stack
    norms, names = next(x for x in _LAYOUTS if _layout_name(x[1]) == stack.layout)
    final = _norm_weight(loaded.adapter.backbone.norm, "final norm")
    layers = loaded.adapter.backbone.layers
    rebuilt = _build(loaded.adapter, layers, norms, names, final, stack.embed_scale, True)
    assert rebuilt.weights.symmetric_linears == 7 * len(layers) - 1
    # Built for float activations (the probe's), every linear reads its biases.
    probe = _build(loaded.adapter, layers, norms, names, final, stack.embed_scale, False)
    assert probe.weights.symmetric_linears == 0


def test_affine_linears_keep_their_biases_in_the_stack(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "1")
    loaded = load_cpu(str(cached_tiny_model("llama", quantize_bits=4, group_size=32)))
    assert loaded.backbone.stack.weights.symmetric_linears == 0


@pytest.mark.parametrize("cache_dtype", [mx.float16, mx.bfloat16])
def test_half_precision_caches_match_the_module_path(cache_dtype):
    # Both round keys and values to the cache dtype once (nearest even) and
    # read them back through the same attention kernels.
    loaded = load_cpu(str(cached_tiny_model("llama", quantize_bits=4, group_size=32)))
    modules = module_path(loaded)
    got, got_k, got_v = _run(loaded, STEPS, seed=3, cache_dtype=cache_dtype)
    want, want_k, want_v = _run(modules, STEPS, seed=3, cache_dtype=cache_dtype)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    # One unit in the last place where the fp32 values (summed in another
    # order) straddle a rounding edge.
    ulp = 2.0**-10 if cache_dtype == mx.float16 else 2.0**-7
    np.testing.assert_allclose(got_k, want_k, rtol=ulp, atol=1e-6)
    np.testing.assert_allclose(got_v, want_v, rtol=ulp, atol=1e-6)


# Families whose blocks the stack computes (norm layouts, fused projections, NoPE
# layers, GELU, multipliers), and families it must decline, each for its reason.
TAKEN = ["gemma", "gemma2", "gemma3_text", "glm4", "granite", "minicpm", "olmo2", "phi3",
         "smollm3", "exaone4", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "ernie4_5_moe",
         "glm4_moe", "dots1", "gpt_oss", "granitemoe"]
DECLINED = {
    "hunyuan_v1_dense": "off by",   # q/k norms after RoPE: the probe step differs
    "ministral3": "off by",         # query scale grows with position: differs near 70000
    "cohere": "not an RMSNorm",     # LayerNorm
    "gpt_neox": "no list of layers",
    "gemma4_text": "share KV entries",
    "phimoe": "not an RMSNorm",
    "afmoe": "off by",              # gated attention output, among others
}
# The routing the probe finds for each MoE family the stack takes (mlx-lm's code).
# Mixtral's softmax over its top-k logits is the renormalised softmax (the same
# weights to rounding), the first candidate the probe tries.
ROUTING = {"qwen2_moe": "(softmax, top-k)", "qwen3_moe": "(softmax, top-k, renormalised)",
           "olmoe": "(softmax, top-k)", "mixtral": "(softmax, top-k, renormalised)",
           "ernie4_5_moe": "(softmax, top-k, renormalised)",
           "glm4_moe": "(sigmoid, grouped top-k, renormalised)",
           "dots1": "(sigmoid, grouped top-k, renormalised)",
           # gpt-oss's softmax over its top-k logits: as Mixtral's.
           "gpt_oss": "(softmax, top-k, renormalised)",
           "granitemoe": "(softmax, top-k, renormalised)"}


def load_family(family: str):
    from tests.family_models import cached_family_model

    return load_cpu(str(cached_family_model(family, quantize_bits=4)))


@pytest.mark.parametrize("family", TAKEN)
def test_family_runs_as_the_stack_and_matches_the_module_path(family):
    loaded = load_family(family)
    assert loaded.backbone.stack is not None
    got, got_k, got_v = _run(loaded, STEPS, seed=4)
    want, want_k, want_v = _run(module_path(loaded), STEPS, seed=4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())
    np.testing.assert_allclose(got_k, want_k, rtol=1e-3, atol=1e-4 * np.abs(want_k).max())


@pytest.mark.parametrize("family,routing", sorted(ROUTING.items()))
def test_moe_routing_is_the_familys(family, routing):
    assert load_family(family).backbone.stack.layout.endswith(routing)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_mxfp4_experts_in_the_stack_match_the_module_path(family):
    from tests.family_models import cached_family_model

    loaded = load_cpu(str(cached_family_model(family, quantize_bits=8, quantize_mode="mxfp4")))
    assert loaded.backbone.stack is not None
    got, _, _ = _run(loaded, STEPS, seed=5)
    want, _, _ = _run(module_path(loaded), STEPS, seed=5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_gguf_experts_of_mixed_precision_run_in_the_stack(family, tmp_path):
    """llama.cpp's K-quant files store the down experts in another type than the gate
    and up ones (here Q4_K -> 4-bit, the 128-wide down rows' Q5_0 fallback -> 8-bit)."""
    from tests.gguf_models import make_family_gguf

    loaded = load_cpu(str(make_family_gguf(tmp_path / "m.gguf", family, "Q4_K")))
    switch = loaded.model.model.layers[0].mlp.switch_mlp
    assert (switch.gate_proj.bits, switch.down_proj.bits) == (4, 8)
    assert loaded.backbone.stack is not None
    got, _, _ = _run(loaded, STEPS, seed=6)
    want, _, _ = _run(module_path(loaded), STEPS, seed=6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


def test_a_moe_spec_that_disagrees_with_its_arrays_is_refused():
    from vllm_metal.native import get_ops

    router = mx.zeros((4, 64))
    experts = [mx.zeros((4, 32, 64)), mx.zeros((4, 32, 64)), mx.zeros((4, 64, 32))]
    # top_k..., router (4), gate/up/down experts (4 each), shared (12), shared gate (4),
    # groups
    ints = [2, 0, 0, 0, 0] + [0] * 4 + [0] * 12 + [0] * 12 + [0] * 4 + [0, 1, 1]
    moe = get_ops().DecoderStackMoe([router, *experts], ints, 1.0, 64)
    assert moe.num_experts == 4
    with pytest.raises(ValueError, match="top_k must be in"):
        get_ops().DecoderStackMoe([router, *experts], [9, *ints[1:]], 1.0, 64)
    with pytest.raises(ValueError, match="MoE down experts"):
        get_ops().DecoderStackMoe([router, *experts[:2], mx.zeros((4, 64, 16))], ints, 1.0, 64)
    with pytest.raises(ValueError, match="describes 4 arrays, got 3"):
        get_ops().DecoderStackMoe([router, *experts[:2]], ints, 1.0, 64)
    with pytest.raises(ValueError, match="MoE router: a dense linear has no zero point"):
        get_ops().DecoderStackMoe([router, *experts], ints[:8] + [8] + ints[9:], 1.0, 64)


@pytest.mark.parametrize("family,why", sorted(DECLINED.items()))
def test_family_the_stack_does_not_compute_keeps_the_module_path(family, why, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="vllm_metal"):
        loaded = load_family(family)
    assert loaded.backbone.stack is None
    said = [r.getMessage() for r in caplog.records]
    assert any(why in m for m in said), said


def test_layers_of_two_kv_cache_groups_share_buffers_as_the_runner_lays_them_out():
    # gemma3_text: sliding and full layers in separate groups (own block tables and
    # slot mappings), one buffer shared by a sliding and a full layer, as vLLM's hybrid
    # KV manager lays them out (a block id belongs to one group at a time).
    loaded = load_family("gemma3_text")
    d = loaded.dims
    groups = [0 if e.window is None else 1 for e in loaded.adapter.entries]
    i32 = lambda v: mx.array(v, dtype=mx.int32)  # noqa: E731

    def run(backbone_of):
        shape = (8, BLOCK, d.num_kv_heads, d.head_dim)
        keys = [mx.zeros(shape) for _ in range(d.num_layers // 2)]
        values = [mx.zeros(shape) for _ in range(d.num_layers // 2)]
        kc = [keys[i // 2] for i in range(d.num_layers)]
        vc = [values[i // 2] for i in range(d.num_layers)]
        rng, outs = np.random.default_rng(5), []
        for cached, new in ((0, 20), (20, 1), (21, 1)):
            pos = list(range(cached, cached + new))
            meta = AttentionMetadata(
                i32(pos), i32([0, new]), i32([cached + new]), [i32([[1, 2]]), i32([[4, 5]])],
                [i32([BLOCK + p for p in pos]), i32([4 * BLOCK + p for p in pos])])
            ctx = ForwardContext(meta, kc, vc, groups=groups)
            ids = mx.array(rng.integers(0, d.vocab_size, (1, new)), dtype=mx.int32)
            with forward_context(ctx):
                h = backbone_of(ids)
            mx.async_eval(h)   # the next step is built before this one runs, as the runner does
            kc, vc = ctx.key_caches, ctx.value_caches
            outs.append(h)
        return [np.array(o) for o in outs]

    assert loaded.backbone.stack is not None
    got = run(loaded.backbone)
    want = run(module_path(loaded).backbone)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


def _with_angles(angles, seed: int):
    """A dress for _run: each row's rotary angles given (M-RoPE), random positions on
    the three axes, as images give them."""
    spread = np.random.default_rng(seed + 1)

    def dress(_, meta):
        rows = int(meta.positions.shape[0])
        grid = np.array(meta.positions)[None] + spread.integers(0, 5, (3, rows))
        meta.rope_angles = mx.array(angles.table(grid))
    return dress


def test_given_rotary_angles_in_the_stack_match_the_module_paths_sectioned_rope():
    from vllm_metal.models.mrope import use_sectioned_rope

    loaded = load_model(str(cached_tiny_model("qwen2")), mx.float32, CpuBackend())
    angles = use_sectioned_rope(loaded.model, [8, 12, 12], interleaved=False)
    assert loaded.backbone.stack is not None
    got = _run(loaded, STEPS, seed=3, dress=_with_angles(angles, 3))[0]
    want = _run(module_path(loaded), STEPS, seed=3, dress=_with_angles(angles, 3))[0]
    plain = _run(loaded, STEPS, seed=3)[0]
    for g, w, p in zip(got, want, plain):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
        assert np.abs(g - p).max() > 1e-2   # the angles were used, not the positions


def test_rotary_angles_of_the_wrong_width_are_refused():
    loaded = load_cpu(str(cached_tiny_model("qwen2")))
    meta = _meta([(0, 0, 3)])
    meta.rope_angles = mx.zeros((2, 3, 7))
    d = loaded.dims
    caches = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    ctx = ForwardContext(meta, caches, [mx.zeros_like(c) for c in caches])
    with forward_context(ctx), pytest.raises(ValueError, match="rope_angles must be float32"):
        loaded.backbone(mx.zeros((1, 3), dtype=mx.int32))


def _with_spans(i, meta):
    """A dress for _run: bidirectional spans in the first step's prompts (key ends:
    positions 2-5 of the first sequence, 0-2 of the second), as a prefix-LM's images."""
    if i == 0:
        meta.key_ends = mx.array([0, 0, 6, 6, 6, 6, 0, 3, 3, 3, 0], dtype=mx.int32)


def test_key_ends_in_the_stack_match_the_module_path():
    loaded = load_model(str(cached_tiny_model("qwen2")), mx.float32, CpuBackend())
    assert loaded.backbone.stack is not None
    got = _run(loaded, STEPS, seed=5, dress=_with_spans)[0]
    want = _run(module_path(loaded), STEPS, seed=5, dress=_with_spans)[0]
    plain = _run(loaded, STEPS, seed=5)[0]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    # The spans' rows changed (and, through the cache, the later steps); row 0 did not.
    assert np.abs(got[0][0, 2:6] - plain[0][0, 2:6]).max() > 1e-2
    np.testing.assert_allclose(got[0][0, :2], plain[0][0, :2], rtol=1e-6, atol=1e-6)
