"""Every family's quantized checkpoint in the CPU backend's default mode (int8
activations, a float16 KV cache), through vllm.LLM with prefills split into
chunks of 32 tokens:

- the mode is in effect (the layers round, the cache is float16);
- greedy output is reproducible: each prompt gives the same tokens alone as in
  the batch of eight;
- the logprobs follow mlx-lm's forward computing with the same roundings
  (int8_reference.py). Random tiny models are chaotic (logits of std ~16: a
  1e-6 relative change of one layer's input moves a logprob by ~0.5 nats), so an
  int8 rounding that flips on a summation-order difference shows; the bounds
  allow that, not a wrong scale, layout or cache (nats on most steps).

test_family_parity.py holds the switch-off mode (VLLM_METAL_CPU_INT8_ACTIVATIONS=0)
to mlx-lm's float32 forward exactly.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm
from tests.e2e.int8_reference import emulating_default_path
from tests.family_models import FAMILIES, HYBRIDS, REMOTE_CODE, cached_family_model
from tests.gguf_models import FAMILY_ARCHS, make_family_gguf, recipe_types

MAX_TOKENS = 12
# One per kind of layer the default path changes: dense attention, a tied and an
# untied head, sliding windows and softcaps, experts, latent attention, a hybrid.
# The rest run with -m slow.
README_FAMILIES = {"llama", "qwen2", "gemma3_text", "qwen2_moe", "deepseek_v3", "qwen3_next"}
README_GGUF = {"llama"}


def _params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1)


def _generate(llm, ids):
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], _params(),
                        use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _check_default_mode(model_dir, family):
    import mlx.core as mx

    from vllm_metal.cpu.fast_linears import runs_int8

    ids = [mlx_reference.tokenize(model_dir, p) for p in PROMPTS]
    llm = make_llm(model_dir, max_model_len=128, max_num_batched_tokens=32,
                   enable_chunked_prefill=True, block_size=16,
                   trust_remote_code=family in REMOTE_CODE,
                   **({"enable_prefix_caching": True} if family in HYBRIDS else {}))
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        assert runs_int8(runner.loaded.model), "a quantized checkpoint takes int8 by default"
        assert runner.kv_dtype == mx.float16
        batch = _generate(llm, ids)
        alone = [_generate(llm, [i])[0] for i in ids]
    finally:
        del llm
        gc.collect()
    steps, lost = [], []
    for prompt_ids, out, single in zip(ids, batch, alone):
        tokens = list(out.token_ids)
        assert tokens == list(single.token_ids), "greedy tokens differ alone and in a batch"
        with emulating_default_path():
            dense = mlx_reference.full_logprobs(model_dir, prompt_ids + tokens, cached=True)
        for step, (token, lps) in enumerate(zip(tokens, out.logprobs)):
            row = dense[len(prompt_ids) - 1 + step]
            steps.append(abs(lps[token].logprob - row[token]))
            lost.append(row.max() - row[token])
    steps, lost = np.array(steps), np.array(lost)
    # Measured on llama/qwen2 (MLX and GGUF): mean 0.03-0.11 nats, the chosen
    # token at most 2.1 nats below the reference's best (near ties flipped by
    # the chaos above); a wrong kernel gives errors of several nats throughout.
    assert np.median(steps) < 0.25 and steps.mean() < 0.5, (np.median(steps), steps.mean())
    assert np.median(lost) < 0.25, np.median(lost)


def _marks(name, readme):
    return pytest.param(name, marks=() if name in readme else pytest.mark.slow)


@pytest.mark.parametrize("family", [_marks(f, README_FAMILIES) for f in sorted(FAMILIES)])
def test_quantized_family_in_default_mode(family):
    _check_default_mode(cached_family_model(family, quantize_bits=4, group_size=32), family)


@pytest.mark.parametrize("family", [_marks(f, README_GGUF) for f in sorted(FAMILY_ARCHS)])
def test_gguf_family_in_default_mode(family, tmp_path_factory):
    recipe = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}
    path = tmp_path_factory.mktemp(f"gguf-{family}") / "model-Q4_K_M.gguf"
    make_family_gguf(path, family, "Q4_K", tensor_types=recipe_types(family, recipe))
    _check_default_mode(path, family)
