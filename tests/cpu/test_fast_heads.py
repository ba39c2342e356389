"""Per-head projections through the expert matmul equal MLX's own products."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.mla import MultiLinear

from vllm_metal.attention.latent_attention import HeadProjection
from vllm_metal.cpu.fast_heads import (
    FastHeadProjection, FastMultiLinear, FastQuantizedMultiLinear, fast_head_class,
)
from vllm_metal.cpu.fast_linears import use_fast_cpu_linears

HEADS, IN, OUT = 4, 64, 96


def _x(*lead):
    return mx.random.normal((*lead, HEADS, 3, IN), key=mx.random.key(1))


def _close(got, want):
    got, want = np.array(got, np.float32), np.array(want, np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("bits,mode", [(None, None), (4, "affine"), (8, "affine"),
                                       (4, "mxfp4")])
@pytest.mark.parametrize("lead", [(), (2,), (5, 1)])
def test_multilinear_matches_mlx(bits, mode, lead):
    layer = MultiLinear(IN, OUT, HEADS)
    if bits is not None:
        layer = layer.to_quantized(32, bits, mode=mode)
    x = _x(*lead)
    want = layer(x)
    layer.__class__ = fast_head_class(layer)
    assert isinstance(layer, (FastMultiLinear, FastQuantizedMultiLinear))
    _close(layer(x), want)
    y = mx.random.normal((*lead, HEADS, 3, OUT), key=mx.random.key(2))
    _close(layer(y, transpose=False), type(layer).__mro__[1].__call__(layer, y, False))


@pytest.mark.parametrize("quantized", [False, True])
def test_head_projection_matches_mlx(quantized):
    w = mx.random.normal((HEADS, OUT, IN), key=mx.random.key(3))
    parts = list(mx.quantize(w, 32, 4)) if quantized else [w, None, None]
    layer = HeadProjection(*parts, 4 if quantized else 0, 32 if quantized else 0, True)
    x = _x(6)
    want = layer(x)
    assert fast_head_class(layer) is FastHeadProjection
    layer.__class__ = FastHeadProjection
    _close(layer(x), want)
    # The other orientation ([H, k, n], quantized along n) is not the op's: MLX keeps it.
    assert fast_head_class(HeadProjection(*parts, 4 if quantized else 0,
                                          32 if quantized else 0, False)) is None


def test_the_switch_reaches_an_mla_model():
    from mlx_lm.utils import load_model

    from tests.family_models import cached_family_model

    model, _ = load_model(cached_family_model("deepseek_v3", quantize_bits=4))
    use_fast_cpu_linears(model)
    attn = model.model.layers[0].self_attn
    assert type(attn.unembed_out) in (FastMultiLinear, FastQuantizedMultiLinear)


def test_the_wrappers_projections_are_switched_at_load():
    """LatentAttention cuts W_UV out of an expanded kv_b_proj after the weights were
    switched; the backend switches the cut too."""
    from tests.family_models import cached_family_model
    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.v1.model_lifecycle import load_model

    loaded = load_model(str(cached_family_model("deepseek_v2", quantize_bits=4)), mx.float32,
                        CpuBackend())
    kinds = {type(m) for _, m in loaded.model.named_modules() if isinstance(m, HeadProjection)}
    assert kinds == {HeadProjection, FastHeadProjection}  # W_UK [H, k, n] stays MLX's
