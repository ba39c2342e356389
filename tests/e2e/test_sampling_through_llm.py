"""Sampling parameters through vllm.LLM against mlx-lm's own log-probabilities."""

import gc
import math

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import make_llm


@pytest.fixture(scope="module")
def llm(llama_dir):
    engine = make_llm(llama_dir, max_logprobs=20)
    yield engine
    del engine
    gc.collect()


def _run(llm, prompt_ids, **params):
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], SamplingParams(**params),
                       use_tqdm=False)
    return out[0]


def test_sample_logprobs_match_dense_forward(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "The history of the river")
    out = _run(llm, prompt, temperature=0.0, max_tokens=6, logprobs=5)
    tokens = list(out.outputs[0].token_ids)
    ref = mlx_reference.full_logprobs(llama_dir, prompt + tokens)
    for step, (token, entry) in enumerate(zip(tokens, out.outputs[0].logprobs)):
        row = ref[len(prompt) - 1 + step]
        assert math.isclose(entry[token].logprob, row[token], abs_tol=2e-3)
        assert entry[token].rank == 1 + int((row > row[token]).sum())
        top5 = np.argsort(-row)[:5]
        assert set(top5.tolist()) <= set(entry)
        for t in top5:
            assert math.isclose(entry[int(t)].logprob, row[t], abs_tol=2e-3)


def test_prompt_logprobs_match_dense_forward(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "Once upon a time there was a small village")
    out = _run(llm, prompt, temperature=0.0, max_tokens=1, prompt_logprobs=3)
    ref = mlx_reference.full_logprobs(llama_dir, prompt)
    entries = out.prompt_logprobs
    assert entries[0] is None and len(entries) == len(prompt)
    for pos in range(1, len(prompt)):
        token = prompt[pos]
        assert math.isclose(entries[pos][token].logprob, ref[pos - 1][token], abs_tol=2e-3)


def test_chunked_prompt_logprobs_equal_unchunked(llama_dir, llm):
    prompt = mlx_reference.tokenize(llama_dir, "Tell me about the history of the city and its "
                                    "people who lived there for many generations")
    whole = _run(llm, prompt, temperature=0.0, max_tokens=1, prompt_logprobs=2).prompt_logprobs
    chunked_llm = make_llm(llama_dir, max_num_batched_tokens=8, enable_chunked_prefill=True)
    try:
        chunked = _run(chunked_llm, prompt, temperature=0.0, max_tokens=1,
                       prompt_logprobs=2).prompt_logprobs
    finally:
        del chunked_llm
        gc.collect()
    for a, b in zip(whole[1:], chunked[1:]):
        assert a.keys() == b.keys()
        for t in a:
            # Chunks take other matmul paths (GEMV vs GEMM): fp32 sums differ in order.
            assert math.isclose(a[t].logprob, b[t].logprob, abs_tol=2e-3)


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "She opened the door and saw")
    params = dict(temperature=1.0, top_p=0.95, max_tokens=12)
    a = _run(llm, prompt, seed=1234, **params).outputs[0].token_ids
    b = _run(llm, prompt, seed=1234, **params).outputs[0].token_ids
    c = _run(llm, prompt, seed=99, **params).outputs[0].token_ids
    assert list(a) == list(b)
    assert list(a) != list(c)


def test_top_k_one_equals_greedy(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "In the beginning")
    sampled = _run(llm, prompt, temperature=0.8, top_k=1, max_tokens=10, seed=3)
    assert list(sampled.outputs[0].token_ids) == mlx_reference.greedy_tokens(llama_dir, prompt, 10)


def test_logit_bias_forces_a_token(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "In the beginning")
    out = _run(llm, prompt, temperature=0.0, max_tokens=4, logit_bias={42: 100.0})
    assert list(out.outputs[0].token_ids) == [42] * 4


def test_allowed_token_ids_restrict_output(llm, llama_dir):
    prompt = mlx_reference.tokenize(llama_dir, "Numbers: one two")
    allowed = [100, 200, 300]
    out = _run(llm, prompt, temperature=1.0, max_tokens=8, allowed_token_ids=allowed, seed=0)
    assert set(out.outputs[0].token_ids) <= set(allowed)
