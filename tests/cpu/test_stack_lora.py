"""LoRA adapters inside the one-node decoder stack: a step with adapters gives what
the module path's LoRA layers give (separate and fused projections, 4-bit bases,
int8 activations), rows without an adapter get the base model, and a step without
adapters hands the stack nothing extra."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

from tests.cpu.test_decoder_stack import BLOCK, _meta
from tests.tiny_models import cached_tiny_model
from vllm_metal.attention.context import ForwardContext, forward_context
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.lora.adapter_files import ModuleUpdate
from vllm_metal.lora.bank import LoRABank
from vllm_metal.lora.layer import wrap_linears
from vllm_metal.v1.model_lifecycle import load_model

RANK = 8
# Two sequences' prefill (7 and 4 tokens) next to a third's (3).
SEQS = [(0, 0, 7), (1, 0, 4), (2, 0, 3)]


def load_with_lora(path: str, slots: int = 2, targets=None, dtype=mx.float32):
    found = {}

    def wrap(model):
        found["bank"] = LoRABank(slots, RANK, dtype)
        found["modules"] = wrap_linears(model, found["bank"], targets)

    loaded = load_model(path, mx.float32, CpuBackend(), wrap)
    return loaded, found["bank"], found["modules"]


def random_adapter(modules, seed: int, rank: int = RANK, every: int = 1):
    """{module: update} for every EVERY-th wrapped module: A [r, in], B [out, r]."""
    rng = np.random.default_rng(seed)
    updates = {}
    for name, m in list(modules.items())[::every]:
        a = rng.normal(0, 1 / np.sqrt(m.in_features), (rank, m.in_features))
        b = rng.normal(0, 1 / np.sqrt(rank), (m.out_features, rank))
        updates[name] = ModuleUpdate(mx.array(a, dtype=mx.float32),
                                     mx.array(b, dtype=mx.float32), 1.5)
    return updates


def step(loaded, seqs, ids):
    d = loaded.dims
    kc = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    vc = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    ctx = ForwardContext(_meta(seqs), kc, vc)
    with forward_context(ctx):
        h = loaded.backbone(ids)
    mx.eval(h)
    return np.array(h)[0]


def both_paths(loaded, bank, adapters, per_seq, seqs=SEQS, seed=0):
    """(stack, module path) hidden [T, hidden] of one step whose sequences use the
    adapters PER_SEQ (0: base)."""
    rows = np.repeat(np.array(per_seq, dtype=np.int64), [n for _, _, n in seqs])
    bank.prepare_step(rows, adapters.__getitem__)
    total = int(rows.shape[0])
    ids = mx.array(np.random.default_rng(seed).integers(0, loaded.dims.vocab_size, (1, total)),
                   dtype=mx.int32)
    modules = dataclasses.replace(loaded, backbone=dataclasses.replace(loaded.backbone, stack=None))
    return step(loaded, seqs, ids), step(modules, seqs, ids)


def _close(got, want, base_gap):
    """The stack's gap to the module path with adapters stays at its gap without."""
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= max(2 * base_gap, 1e-5 * scale), \
        (np.abs(got - want).max(), base_gap, scale)


@pytest.mark.parametrize("kwargs", [{}, {"quantize_bits": 4, "group_size": 32}])
def test_stack_with_adapters_matches_the_module_paths_lora_layers(kwargs):
    loaded, bank, modules = load_with_lora(str(cached_tiny_model("llama", **kwargs)))
    assert loaded.backbone.stack is not None and loaded.backbone.stack.lora is not None
    adapters = {1: random_adapter(modules, 1), 2: random_adapter(modules, 2, rank=4, every=2)}
    base_got, base_want = both_paths(loaded, bank, adapters, [0, 0, 0])
    base_gap = np.abs(base_got - base_want).max()
    got, want = both_paths(loaded, bank, adapters, [1, 0, 2])
    _close(got, want, base_gap)
    # The adapters change the rows that use them, and only those.
    assert np.abs(got[:7] - base_got[:7]).max() > 1e-2
    assert np.abs(got[11:] - base_got[11:]).max() > 1e-2
    np.testing.assert_array_equal(got[7:11], base_got[7:11])


def test_fused_projections_take_their_slices_of_the_update():
    from tests.family_models import cached_family_model

    loaded, bank, modules = load_with_lora(str(cached_family_model("phi3", quantize_bits=4)))
    assert any(name.endswith("qkv_proj") for name in modules)
    assert any(name.endswith("gate_up_proj") for name in modules)
    assert loaded.backbone.stack is not None and loaded.backbone.stack.lora is not None
    adapters = {1: random_adapter(modules, 3)}
    base_got, base_want = both_paths(loaded, bank, adapters, [0, 0, 0])
    got, want = both_paths(loaded, bank, adapters, [1, 1, 0])
    _close(got, want, np.abs(base_got - base_want).max())
    assert np.abs(got[:11] - base_got[:11]).max() > 1e-2


def test_int8_activations_update_from_the_real_activations(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "1")
    path = str(cached_tiny_model("llama", quantize_bits=4, group_size=32))
    loaded, bank, modules = load_with_lora(path)
    assert loaded.backbone.stack is not None and loaded.backbone.stack.lora is not None
    adapters = {1: random_adapter(modules, 4)}
    base_got, base_want = both_paths(loaded, bank, adapters, [0, 0, 0])
    got, want = both_paths(loaded, bank, adapters, [1, 1, 1])
    # Int8 rounding edges blur both gaps alike (tests/cpu/test_decoder_stack.py).
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= max(2 * np.abs(base_got - base_want).max(), 0.02 * scale)


def test_a_row_alone_and_in_a_mixed_step_differs_only_as_the_base_does():
    # The stack's matmuls tile a 4-row step otherwise than a 14-row one (last-bit
    # differences in the base model too); the updates add no difference of their own.
    loaded, bank, modules = load_with_lora(str(cached_tiny_model("llama")))
    adapters = {1: random_adapter(modules, 5), 2: random_adapter(modules, 6, every=3)}
    ids = mx.array(np.random.default_rng(7).integers(0, loaded.dims.vocab_size, (1, 14)),
                   dtype=mx.int32)

    def gap(mixed_rows, alone_rows):
        bank.prepare_step(np.repeat(mixed_rows, [7, 4, 3]), adapters.__getitem__)
        mixed = step(loaded, SEQS, ids)
        bank.prepare_step(np.full(4, alone_rows), adapters.__getitem__)
        alone = step(loaded, [SEQS[1]], ids[:, 7:11])
        return np.abs(mixed[7:11] - alone).max(), np.abs(alone).max()

    base_gap, _ = gap([0, 0, 0], 0)
    lora_gap, scale = gap([2, 1, 0], 1)
    assert lora_gap <= max(2 * base_gap, 1e-6 * scale)


def test_steps_without_adapters_pass_nothing_extra():
    loaded, bank, modules = load_with_lora(str(cached_tiny_model("llama")))
    bank.prepare_step(np.zeros(5, dtype=np.int64), lambda i: {})
    stack = loaded.backbone.stack
    assert stack.lora.step(stack.weights) is None
    # An adapter that targets only some modules: only their sites get updates.
    only = {n: u for n, u in random_adapter(modules, 8).items() if n.endswith("o_proj")}
    bank.prepare_step(np.array([0, 1, 1, 0, 0]), {1: only}.__getitem__)
    lora, rows = stack.lora.step(stack.weights)
    assert lora.sites == [(layer, 3) for layer in range(loaded.dims.num_layers)]   # o_proj
    np.testing.assert_array_equal(np.array(rows), [-1, 0, 0, -1, -1])
    # Resolved once per change of the resident adapters, not per step.
    bank.prepare_step(np.array([1, 0]), {1: only}.__getitem__)
    assert stack.lora.step(stack.weights)[0] is lora


def test_a_new_adapter_is_resolved_again_and_used():
    # Placing another adapter changes the bank's stacks: the next step resolves them
    # again and computes with the new values (the earlier set keeps the old ones).
    loaded, bank, modules = load_with_lora(str(cached_tiny_model("llama")), slots=1)
    stack = loaded.backbone.stack
    ids = mx.array([[3, 5, 7]], dtype=mx.int32)
    seqs = [(0, 0, 3)]
    first, second = random_adapter(modules, 11), random_adapter(modules, 12)
    bank.prepare_step(np.ones(3), {1: first}.__getitem__)
    with_first, lora = step(loaded, seqs, ids), stack.lora.step(stack.weights)[0]
    bank.prepare_step(np.full(3, 2), {2: second}.__getitem__)   # evicts the first
    with_second = step(loaded, seqs, ids)
    assert stack.lora.step(stack.weights)[0] is not lora
    bank.prepare_step(np.ones(3), {1: first}.__getitem__)
    np.testing.assert_array_equal(step(loaded, seqs, ids), with_first)
    assert np.abs(with_second - with_first).max() > 1e-2


def test_the_resolved_adapters_are_checked_against_the_weights():
    from vllm_metal.native import get_ops

    loaded, bank, modules = load_with_lora(str(cached_tiny_model("llama")))
    weights = loaded.backbone.stack.weights
    name = next(n for n in modules if n.endswith("q_proj"))
    q = modules[name]
    a = mx.zeros((2, RANK, q.in_features))
    b = mx.zeros((2, RANK, q.out_features))
    scale = mx.zeros((2,))
    make = get_ops().DecoderStackLora
    assert make(weights, [0, 0, 0, 0], [a, b, scale], [1, 0]).sites == [(0, 0)]
    cases = [
        (([0, 0, 1, 0], [a, b, scale], [1, 0]), "no module 1"),
        (([0, 0, 0, 1], [a, b, scale], [1, 0]), "outside b's"),
        (([0, 6, 0, 0], [a, b, scale], [1, 0]), "does not match the projection"),   # down_proj
        (([0, 0, 0, 0, 0, 0, 0, 0], [a, b, scale], [1, 0]), "ordered"),
        (([99, 0, 0, 0], [a, b, scale], [1, 0]), "no layer 99"),
        (([0, 0, 0, 0], [a, b.astype(mx.bfloat16), scale], [1, 0]), "one dtype"),
        (([0, 0, 0, 0], [a, b[:, :2], scale], [1, 0]), "disagree"),
        (([0, 0, 0, 0], [a, b, scale], [1]), "filled"),
    ]
    for (table, arrays, filled), message in cases:
        with pytest.raises(ValueError, match=message):
            make(weights, table, arrays, filled)
    lora = make(weights, [0, 0, 0, 0], [a, b, scale], [1, 0])
    other, _, _ = load_with_lora(str(cached_tiny_model("llama")))
    d = loaded.dims
    caches = [mx.zeros((4, BLOCK, d.num_kv_heads, d.head_dim)) for _ in range(d.num_layers)]
    meta = _meta([(0, 0, 2)])
    with pytest.raises(ValueError, match="other weights"):
        get_ops().decoder_stack(other.backbone.stack.weights, mx.zeros((1, 2, q.in_features)), caches,
                                caches, meta.positions, meta.slot_mapping, meta.block_tables,
                                meta.seq_lens, meta.cu_seqlens_q, [0] * d.num_layers, lora,
                                mx.array([0, -1]))


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_half_adapters_give_what_float32_adapters_of_their_values_give(dtype):
    # --lora-dtype bfloat16/float16: the stack reads the half weights as float32, so
    # the only difference from float32 adapters is the weights' rounding.
    path = str(cached_tiny_model("llama", quantize_bits=4, group_size=32))
    half, half_bank, modules = load_with_lora(path, dtype=dtype)
    full, full_bank, _ = load_with_lora(path)
    assert half.backbone.stack is not None and half.backbone.stack.lora is not None
    adapter = random_adapter(modules, 9)
    rounded = {n: ModuleUpdate(u.a.astype(dtype).astype(mx.float32),
                               u.b.astype(dtype).astype(mx.float32), u.scale)
               for n, u in adapter.items()}
    got, _ = both_paths(half, half_bank, {1: adapter}, [1, 0, 1])
    want, _ = both_paths(full, full_bank, {1: rounded}, [1, 0, 1])
    np.testing.assert_array_equal(got, want)
    base, _ = both_paths(full, full_bank, {1: rounded}, [0, 0, 0])
    assert np.abs(got[:7] - base[:7]).max() > 1e-2
