"""Every listed family (dense and MoE): greedy tokens and logprobs through
vllm.LLM equal mlx-lm's, with the CPU backend's fast path switched off
(VLLM_METAL_CPU_INT8_ACTIVATIONS=0; quantized checkpoints take it by default,
test_default_mode.py), so the arithmetic is mlx-lm's up to summation order.

One engine per family, set up so one run crosses every path that could treat a
family wrong: eight prompts of different lengths in one batch, prefills split
into chunks of 32 tokens, a KV pool too small for all of them (preemption and
recomputation), a repeated prompt (prefix-cache hit), and windows of 16 tokens
on the sliding-window families, which the prompts cross.
"""

import gc

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm
from tests.family_models import FAMILIES, HYBRIDS, REMOTE_CODE, cached_family_model
from tests.gguf_models import FAMILY_ARCHS, MXFP4_EXPERTS, make_family_gguf, recipe_types

pytestmark = pytest.mark.usefixtures("exact_arithmetic")

MAX_TOKENS = 16
TOP_LOGPROBS = 3
# fp32 through different kernels and summation orders: logprobs agree to ~1e-4.
LOGPROB_TOL = 2e-3


def _run(llm, ids, max_tokens=MAX_TOKENS):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=TOP_LOGPROBS)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _check(model_dir, prompt_ids, out, rtol=0.0):
    want = mlx_reference.greedy_tokens(model_dir, prompt_ids, MAX_TOKENS)
    tokens = list(out.token_ids)
    assert tokens == want
    # The engine's logprobs at each step against one dense mlx-lm forward over
    # prompt + output (teacher forcing): the chosen token's and the top-k's.
    dense = mlx_reference.full_logprobs(model_dir, prompt_ids + tokens)
    for step, (token, lps) in enumerate(zip(tokens, out.logprobs)):
        row = dense[len(prompt_ids) - 1 + step]
        assert lps[token].logprob == pytest.approx(row[token], abs=LOGPROB_TOL, rel=rtol)
        top = sorted(lps.items(), key=lambda kv: -kv[1].logprob)[:TOP_LOGPROBS]
        np.testing.assert_allclose([lp.logprob for _, lp in top], np.sort(row)[::-1][:TOP_LOGPROBS],
                                   atol=LOGPROB_TOL, rtol=rtol)


# Gemma 4's three sliding groups each keep window + chunk tokens of blocks, as do the
# five one-layer sliding groups of the Gemma 3 GGUF (llama.cpp's fixed window pattern
# of 6 over 6 layers).
_POOL_BLOCKS = {"gemma4_text": 28, "gguf-gemma3_text": 40}
# Gated DeltaNet hybrids: a block holds a request's recurrent state, so vLLM's blocks
# are 32 tokens here (not 16) and fewer of them fill the pool; each request's state takes one
# block (two while its state moves on in align mode) besides its attention blocks.
_POOL_BLOCKS.update({family: 9 for family in HYBRIDS - {"lfm2"}})
# Nemotron-H's one attention layer and two Mamba2 ones: vLLM needs 13 blocks to hold
# one 128-token request (it refuses 11).
_POOL_BLOCKS["nemotron_h"] = 13
# Mamba2 alone: a request holds a fixed number of state blocks from its first step,
# so a small pool admits fewer requests at once and never preempts one.
_NEVER_PREEMPTS = {"mamba2"}


def _preemptions(llm) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_mlx_lm(family):
    _check_engine(cached_family_model(family), family)


def test_mxfp4_experts_match_mlx_lm():
    """gpt-oss as mlx-community ships it: MXFP4 experts, everything else 8-bit."""
    _check_engine(cached_family_model("gpt_oss", quantize_bits=8, quantize_mode="mxfp4"), "gpt_oss")


@pytest.mark.slow   # the README suite runs GGUF's own tests (tests/gguf); these go with .ci/run
@pytest.mark.parametrize("family", sorted(FAMILY_ARCHS))
def test_gguf_family_matches_mlx_lm(family, tmp_path_factory):
    """A llama.cpp-style Q4_K_M file of each GGUF architecture (Q4_K weights, Q6_K for
    attn_v, ffn_down and the head)."""
    recipe = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}
    path = tmp_path_factory.mktemp(f"gguf-{family}") / "model-Q4_K_M.gguf"
    make_family_gguf(path, family, "Q4_K", tensor_types=recipe_types(family, recipe))
    _check_engine(path, family, _POOL_BLOCKS.get(f"gguf-{family}", 17))


def test_gguf_mxfp4_experts_match_mlx_lm(tmp_path_factory):
    """gpt-oss as llama.cpp converts it: MXFP4 experts, Q8_0 elsewhere."""
    path = tmp_path_factory.mktemp("gguf-gpt_oss-mxfp4") / "model-MXFP4.gguf"
    make_family_gguf(path, "gpt_oss", "Q8_0", tensor_types=recipe_types("gpt_oss", MXFP4_EXPERTS))
    _check_engine(path, "gpt_oss")


def _check_engine(model_dir, family, pool_blocks=None):
    ids = [mlx_reference.tokenize(model_dir, p) for p in PROMPTS]
    # 16 usable blocks of 16 tokens (one more is vLLM's null block), shared by
    # the KV cache groups, hold one 128-token request but not eight prompts
    # and their outputs at once (some families need a few more).
    # Hybrids serve without prefix caching by default; asked for, it is vLLM's align
    # mode (states saved at block boundaries), which this run then crosses too.
    llm = make_llm(model_dir, max_model_len=128, max_num_batched_tokens=32,
                   enable_chunked_prefill=True, block_size=16,
                   num_gpu_blocks_override=pool_blocks or _POOL_BLOCKS.get(family, 17),
                   trust_remote_code=family in REMOTE_CODE, disable_log_stats=False,
                   **({"enable_prefix_caching": True} if family in HYBRIDS else {}))
    try:
        before = _preemptions(llm)
        for prompt_ids, out in zip(ids, _run(llm, ids)):
            _check(model_dir, prompt_ids, out)
        if family not in _NEVER_PREEMPTS:
            assert _preemptions(llm) > before, "the pool was meant to force preemption"
        # The longest prompt again: its full blocks come from the prefix cache.
        longest = max(ids, key=len)
        _check(model_dir, longest, _run(llm, [longest])[0])
    finally:
        del llm
        gc.collect()
