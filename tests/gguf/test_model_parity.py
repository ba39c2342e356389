"""Logits of `load_gguf_model` vs transformers' own GGUF load and vs mlx-lm on the HF source."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.gguf.reference import (
    assert_close_logits, transformers_gguf_model, transformers_logits,
)
from tests.gguf_models import hf_dir_for
from vllm_metal.gguf.loader import load_gguf_model

FAMILIES = ("llama", "qwen2", "qwen3")
QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
PROMPT_IDS = [0, 5, 17, 33, 90, 200, 301, 7, 64, 128, 255, 399]


def our_logits(path, dtype=mx.float32) -> np.ndarray:
    model, _ = load_gguf_model(path, dtype)
    return np.array(model(mx.array([PROMPT_IDS]))[0].astype(mx.float32))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(tiny_gguf, family, qtype):
    path = tiny_gguf(family, qtype)
    ref = transformers_logits(transformers_gguf_model(path), PROMPT_IDS)
    # Both sides dequantize the same blocks exactly; only fp32 summation order differs.
    assert_close_logits(our_logits(path), ref, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_float_gguf_matches_mlx_lm_on_source_checkpoint(tiny_gguf, family):
    from mlx_lm.utils import load_model

    source, _ = load_model(hf_dir_for(family))
    ref = np.array(source(mx.array([PROMPT_IDS]))[0])
    assert_close_logits(our_logits(tiny_gguf(family, "F32")), ref, rtol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "yarn", "llama3"])
def test_rope_scaling_matches_mlx_lm_on_source_checkpoint(tiny_gguf, kind):
    from mlx_lm.utils import load_model

    source, _ = load_model(hf_dir_for("llama", rope_scaling=kind))
    ref = np.array(source(mx.array([PROMPT_IDS]))[0])
    unscaled = our_logits(tiny_gguf("llama", "F32"))
    scaled = our_logits(tiny_gguf("llama", "F32", rope_scaling=kind))
    assert_close_logits(scaled, ref, rtol=1e-5)
    assert np.abs(unscaled - ref).max() > 1e-3 * np.abs(ref).max()  # scaling took effect


def test_quantized_modules_stay_quantized(tiny_gguf):
    import mlx.nn as nn

    model, _ = load_gguf_model(tiny_gguf("qwen3", "Q4_1"), mx.float32)
    layer = model.model.layers[0]
    for module, bits in ((layer.self_attn.q_proj, 4), (layer.mlp.down_proj, 4),
                         (model.model.embed_tokens, 4)):
        assert isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))
        assert (module.bits, module.group_size) == (bits, 32)
    assert isinstance(layer.self_attn.q_norm, nn.RMSNorm)
    q8, _ = load_gguf_model(tiny_gguf("llama", "Q8_0"), mx.float32)
    assert q8.lm_head.bits == 8


# bf16 keeps 8 mantissa bits; the tiny models' large gains (logits ~100) amplify that.
@pytest.mark.parametrize("dtype,rtol", [(mx.float16, 0.02), (mx.bfloat16, 0.15)])
def test_dtype_casts_floats_scales_and_biases(tiny_gguf, dtype, rtol):
    path = tiny_gguf("llama", "Q4_1")
    model, _ = load_gguf_model(path, dtype)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.scales.dtype == dtype and q_proj.biases.dtype == dtype
    assert q_proj.weight.dtype == mx.uint32
    assert model.model.norm.weight.dtype == dtype
    ref = our_logits(path)
    low = np.array(model(mx.array([PROMPT_IDS]))[0].astype(mx.float32))
    assert np.abs(low - ref).max() < rtol * np.abs(ref).max()


@pytest.mark.parametrize("dtype", [mx.int32, "float32", None])
def test_bad_dtype_is_refused(tiny_gguf, dtype):
    with pytest.raises(TypeError, match="dtype"):
        load_gguf_model(tiny_gguf("llama", "F32"), dtype)
