"""CpuBackend's hooks: the KV cache dtype and commit, the dtypes, the model's
preparation (fast linears, then the decoder stack or the module path)."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest
import torch

from tests.tiny_models import cached_tiny_model
from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.cpu.fast_linears import FastQuantizedLinear
from vllm_metal.v1.model_lifecycle import load_model


@pytest.mark.parametrize("name,dtype", [("auto", None), ("float16", mx.float16),
                                        ("bfloat16", mx.bfloat16)])
def test_kv_cache_dtype_follows_the_variable(monkeypatch, name, dtype):
    monkeypatch.setenv("VLLM_METAL_CPU_KV_CACHE_DTYPE", name)
    assert CpuBackend().kv_cache_dtype() == dtype


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
