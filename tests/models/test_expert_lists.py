"""Per-expert-list MoE blocks (mlx-lm's DBRX) restacked into a SwitchGLU equal the
family's own token-by-token block."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load_model

from tests.family_models import cached_family_model
from vllm_metal.models.expert_lists import StackedExperts, restack_expert_lists

TOKENS = mx.array([[3, 17, 99, 250, 31, 7, 480, 12]])


@pytest.mark.parametrize("bits", [None, 4, 8])
def test_dbrx_restacked_equals_its_own_blocks(bits):
    path = cached_family_model("dbrx", **({} if bits is None else {"quantize_bits": bits}))
    model, _ = load_model(path)
    want = np.array(model(TOKENS))
    assert restack_expert_lists(model.layers) == len(model.layers)
    assert all(isinstance(layer.ffn, StackedExperts) for layer in model.layers)
    got = np.array(model(TOKENS))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_experts_that_differ_keep_the_familys_block():
    import mlx.nn as nn

    model, _ = load_model(cached_family_model("dbrx", quantize_bits=4))
    block = model.layers[0].ffn
    w1 = block.experts[0].w1
    block.experts[0].w1 = nn.QuantizedLinear.from_linear(
        nn.Linear(w1.weight.shape[1] * 32 // w1.bits, w1.weight.shape[0], bias=False), bits=8)
    assert restack_expert_lists(model.layers) == len(model.layers) - 1
    assert type(model.layers[0].ffn).__name__ == "SparseMoeBlock"
