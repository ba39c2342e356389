"""MetalBackend's hooks that need no GPU: what it refuses at load and what it leaves
to MLX."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from vllm_metal.metal.backend import MetalBackend, check_head_size
from vllm_metal.models.adapter import UnsupportedModelError


def test_a_head_size_without_metal_kernels_is_refused():
    check_head_size("llama", 128)
    with pytest.raises(UnsupportedModelError, match="llama: head size 40 has no Metal"):
        check_head_size("llama", 40)


def test_mlx_keeps_every_layer():
    model = nn.Sequential(nn.Linear(8, 8), nn.QuantizedLinear(64, 32, bits=4, group_size=32),
                          nn.Embedding(10, 8))
    kinds = [type(m) for _, m in model.named_modules()]
    MetalBackend().prepare_weights(model)
    assert [type(m) for _, m in model.named_modules()] == kinds


def test_kv_cache_is_the_budgets_in_the_models_dtype():
    backend = MetalBackend()
    assert backend.kv_cache_cap() is None
    assert backend.kv_cache_dtype(nn.QuantizedLinear(64, 32, bits=4, group_size=32)) is None
    assert backend.device == mx.gpu and not backend.sampling_kernels
