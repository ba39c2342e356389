"""CpuBackend's hooks: the KV cache dtype and commit, the dtypes, the model's
preparation (fast linears, then the decoder stack or the module path)."""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
import pytest
import torch

from tests.tiny_models import cached_tiny_model
from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.cpu.fast_linears import FastQuantizedLinear
from vllm_metal.v1.model_lifecycle import load_model


def _loaded(bits: int | None) -> nn.Module:
    path = cached_tiny_model("llama", **({"quantize_bits": bits, "group_size": 32} if bits else {}))
    return load_model(str(path), mx.float32, CpuBackend()).model


@pytest.mark.parametrize("name,dtype", [("float16", mx.float16), ("bfloat16", mx.bfloat16)])
@pytest.mark.parametrize("bits", [None, 4])
def test_kv_cache_dtype_follows_the_variable(monkeypatch, name, dtype, bits):
    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_DTYPE", name)
    assert CpuBackend().kv_cache_dtype(_loaded(bits)) == dtype


@pytest.mark.parametrize("setting", ["", "auto", "1", "0"])
@pytest.mark.parametrize("bits", [None, 4, 8])
def test_quantized_models_run_int8_with_a_half_cache_unless_switched_off(
        monkeypatch, setting, bits):
    # The default (auto): a quantized checkpoint takes the fast path, int8
    # activations and an fp16 cache; a float one keeps fp32 activations and its
    # dtype in the cache. 0 restores mlx-lm's arithmetic for both.
    if setting:
        monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", setting)
    else:
        monkeypatch.delenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", raising=False)
    monkeypatch.delenv("VLLM_METAL_CPU_KV_CACHE_DTYPE", raising=False)
    model = _loaded(bits)
    fast = bits is not None and setting != "0"
    layers = [m for _, m in model.named_modules() if hasattr(m, "int8_activations")]
    assert layers if bits else not layers
    assert all(m.int8_activations == fast for m in layers)
    # Asked for (1) or chosen (auto), int8 computes on fp32 activations.
    chosen = setting == "1" or fast
    embed = model.model.embed_tokens
    assert str(embed.activation_dtype) == str(mx.float32 if chosen else None)
    assert CpuBackend().kv_cache_dtype(model) == (mx.float16 if fast else None)


def test_the_layers_stay_exact_until_the_backbone_is_planned(monkeypatch):
    # The adapter's checks compare its wrappers with the modules' own forward:
    # prepare_weights leaves float32 arithmetic; prepare_backbone turns int8 on.
    monkeypatch.delenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", raising=False)
    model = nn.Sequential(nn.Embedding(64, 64), nn.Linear(64, 64))
    nn.quantize(model, group_size=32, bits=4)
    CpuBackend().prepare_weights(model)
    assert not model.layers[1].int8_activations
    assert str(model.layers[0].activation_dtype) == str(mx.float32)


def test_an_unknown_int8_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "fast")
    with pytest.raises(ValueError, match="VLLM_METAL_CPU_INT8_ACTIVATIONS.*auto, 1 or 0"):
        _loaded(4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux dtypes")
def test_dtype_auto_means_float32_on_linux():
    assert CpuBackend().supported_dtypes() == [torch.float32]


def test_kv_cache_stays_on_small_pages_when_asked(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_HUGE_PAGES", "0")
    cache = PagedKVCache(2, 4, 16, 2, 64, mx.float32)
    assert CpuBackend().commit_kv_cache(cache) == 0


def test_quantized_llama_runs_as_one_node_on_the_fast_linears():
    loaded = load_model(str(cached_tiny_model("llama", quantize_bits=4, group_size=32)),
                        mx.float32, CpuBackend())
    layer = loaded.adapter.backbone.layers[0]
    assert type(layer.self_attn.q_proj) is FastQuantizedLinear
    assert loaded.backbone.stack is not None
    assert "decoder stack as one CPU node" in loaded.backbone.summary


def test_without_the_stack_the_module_path(monkeypatch):
    monkeypatch.setenv("VLLM_METAL_CPU_DECODER_STACK", "0")
    loaded = load_model(str(cached_tiny_model("llama")), mx.float32, CpuBackend())
    assert loaded.backbone.stack is None
    assert "linear/embedding/expert layers on the fast CPU path" in loaded.backbone.summary


def test_kv_cache_keys_are_columns_where_the_cpu_kernel_reads_them():
    from vllm_metal.attention.kv_quant import resolve

    assert CpuBackend.key_columns
    for head_dim in (64, 128, 256):
        cache = PagedKVCache(2, 5, 16, 3, head_dim, mx.float16, key_columns=True)
        assert cache.key_columns
        assert cache.key_caches[0].shape == (5, 3, head_dim, 16)
        assert cache.value_caches[0].shape == (5, 16, 3, head_dim)
        # A block has the bytes of a row-layout block: the budget is unchanged.
        assert cache.nbytes == 5 * PagedKVCache.bytes_per_block(2, 16, 3, head_dim, mx.float16)
    # Head sizes the pieces kernel does not take, quantized rows and MLA latents keep rows.
    for kwargs in ({"head_dim": 80}, {"quant": resolve("int8")}, {"latent": True}):
        args = {"head_dim": 64, **kwargs}
        head_dim = args.pop("head_dim")
        cache = PagedKVCache(2, 5, 16, 1 if "latent" in args else 3, head_dim, mx.float16,
                             key_columns=True, **args)
        assert not cache.key_columns
        assert cache.key_caches[0].shape[1] == 16
