"""Speculative decoding through vllm.LLM: greedy tokens equal mlx-lm's with drafts in
any batch, acceptance as the drafts deserve, and bad configurations refused."""

import gc
import re

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}
MAX_TOKENS = 32


def _metric(llm, name, required=True):
    for m in llm.get_metrics():
        if m.name == name:
            return getattr(m, "value", None) if hasattr(m, "value") else m.values
    if required:
        raise AssertionError(f"no metric {name}")
    return None


def _prompts(model_dir):
    # Repeated phrases give the prompt lookup something to find.
    texts = PROMPTS + [PROMPTS[1] + " " + PROMPTS[1], "a b c d a b c d a b c d a b"]
    return [mlx_reference.tokenize(model_dir, t) for t in texts]


@pytest.fixture(scope="module")
def ngram_llm(llama_dir):
    llm = make_llm(llama_dir, speculative_config=NGRAM, enable_prefix_caching=True,
                   max_num_batched_tokens=64, disable_log_stats=False)
    yield llm
    del llm
    gc.collect()


_COUNTERS = {"preempted": "vllm:num_preemptions",
             "drafted": "vllm:spec_decode_num_draft_tokens",
             "accepted": "vllm:spec_decode_num_accepted_tokens"}


def _run_engine(model_dir, batches, params, **llm_kwargs):
    """Each batch of prompts through one fresh engine, in turn -> (each batch's token
    lists, the engine's preemption, draft and acceptance counts: None without
    speculation)."""
    llm = make_llm(model_dir, disable_log_stats=False, **llm_kwargs)
    try:
        outs = [_generate(llm, batch, params) for batch in batches]
        counts = {key: _metric(llm, name, required=False) for key, name in _COUNTERS.items()}
    finally:
        del llm
        gc.collect()
    return outs, counts


def _generate(llm, prompts, params):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_ngram_greedy_equals_mlx_lm_in_a_batch(llama_dir, ngram_llm):
    """Ten requests at once, prompts chunked at 64 tokens: every request's tokens are
    mlx-lm's greedy tokens, and drafts were accepted along the way."""
    prompts = _prompts(llama_dir)
    got = _generate(ngram_llm, prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for prompt, tokens in zip(prompts, got):
        assert tokens == mlx_reference.greedy_tokens(llama_dir, prompt, MAX_TOKENS)
    assert _metric(ngram_llm, "vllm:spec_decode_num_accepted_tokens") > 0


def test_ngram_prefix_hits_and_repeats_are_identical(llama_dir, ngram_llm):
    """The same prompts again (prefix-cache hits) and one alone give the same tokens."""
    prompts = _prompts(llama_dir)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    first = _generate(ngram_llm, prompts, params)
    again = _generate(ngram_llm, prompts, params)
    alone = _generate(ngram_llm, prompts[-1:], params)
    assert again == first
    assert alone[0] == first[-1]


def test_acceptance_counts_match_a_replay_of_the_rule(llama_dir, ngram_llm):
    """One request alone: every step's drafts are vLLM's prompt lookup of the tokens so
    far, and the accepted ones are exactly the drafts that match mlx-lm's continuation.
    Replaying that on the reference tokens gives the step and acceptance counts."""
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as lookup,
    )

    prompt = _prompts(llama_dir)[-1]
    expected = mlx_reference.greedy_tokens(llama_dir, prompt, MAX_TOKENS)
    before = {n: _metric(ngram_llm, n) for n in (
        "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens")}
    got = _generate(ngram_llm, [prompt], SamplingParams(temperature=0.0,
                                                        max_tokens=MAX_TOKENS))[0]
    assert got == expected
    drafts = draft_tokens = accepted = 0
    done = 1                                    # the prefill step emits one token
    while done < len(expected):
        context = np.asarray(prompt + expected[:done], dtype=np.int32)
        proposal = lookup(context, NGRAM["prompt_lookup_min"], NGRAM["prompt_lookup_max"],
                          512, NGRAM["num_speculative_tokens"]).tolist()
        # The scheduler never drafts past max_tokens: the last token has no use.
        proposal = proposal[:max(len(expected) - done - 1, 0)]
        hit = 0
        while hit < len(proposal) and proposal[hit] == expected[done + hit]:
            hit += 1
        if proposal:
            drafts += 1
            draft_tokens += len(proposal)
            accepted += hit
        done += hit + 1
    assert _metric(ngram_llm, "vllm:spec_decode_num_drafts") - before[
        "vllm:spec_decode_num_drafts"] == drafts
    assert _metric(ngram_llm, "vllm:spec_decode_num_draft_tokens") - before[
        "vllm:spec_decode_num_draft_tokens"] == draft_tokens
    assert _metric(ngram_llm, "vllm:spec_decode_num_accepted_tokens") - before[
        "vllm:spec_decode_num_accepted_tokens"] == accepted
    assert accepted > 0


def test_ngram_logprobs_are_the_plain_runs(llama_dir, ngram_llm):
    """Logprobs of accepted drafts come from their verification rows: the same values
    (to rounding) and the same top tokens as the run without speculation."""
    prompt = _prompts(llama_dir)[-1]
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=3)
    spec = ngram_llm.generate([TokensPrompt(prompt_token_ids=prompt)], params,
                              use_tqdm=False)[0].outputs[0]
    ref = mlx_reference.full_logprobs(llama_dir, prompt + list(spec.token_ids))
    for i, (token, entry) in enumerate(zip(spec.token_ids, spec.logprobs)):
        row = ref[len(prompt) - 1 + i]
        assert abs(entry[token].logprob - row[token]) < 1e-3
        top = sorted(((lp.rank, t) for t, lp in entry.items() if lp.rank <= 3))
        assert [t for _, t in top][:1] == [int(np.argmax(row))]


def test_penalties_and_seeds_with_drafts(llama_dir, ngram_llm):
    """A repetition penalty reads the drafts before each row: greedy tokens equal the
    plain engine's; a seeded sampled request repeats itself in any batch."""
    prompts = _prompts(llama_dir)
    penal = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.3,
                           frequency_penalty=0.2)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=MAX_TOKENS)
    spec_penal = _generate(ngram_llm, prompts[-2:], penal)
    spec_seeded = _generate(ngram_llm, prompts, [seeded] * len(prompts))
    alone_seeded = _generate(ngram_llm, prompts[-1:], seeded)
    assert alone_seeded[0] == spec_seeded[-1]
    (plain,), _ = _run_engine(llama_dir, [prompts[-2:]], penal, max_num_batched_tokens=64)
    assert plain == spec_penal


def test_grammar_constrained_requests_with_drafts(llama_dir, ngram_llm):
    """A regex-constrained request checks each draft against the grammar's mask for its
    row: the answer matches the pattern and equals the plain engine's."""
    from vllm.sampling_params import StructuredOutputsParams

    prompts = _prompts(llama_dir)[-3:]
    params = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=(
        StructuredOutputsParams(regex=r"(a b c d ){2,6}[0-9]{3}")))
    spec = ngram_llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                              use_tqdm=False)
    (plain,), _ = _run_engine(llama_dir, [prompts], params, max_num_batched_tokens=64)
    for out, tokens in zip(spec, plain):
        assert re.fullmatch(r"(a b c d ){2,6}[0-9]{3}", out.outputs[0].text)
        assert list(out.outputs[0].token_ids) == tokens


def test_preempted_requests_keep_their_tokens(llama_dir):
    """A KV pool too small for the batch preempts requests mid-draft; each still ends
    with mlx-lm's greedy tokens."""
    prompts = [p[:40] for p in _prompts(llama_dir)]
    (got,), counts = _run_engine(llama_dir, [prompts], SamplingParams(temperature=0.0,
                                                                      max_tokens=48),
                                 speculative_config=NGRAM, **_SMALL_POOL)
    for prompt, tokens in zip(prompts, got):
        assert tokens == mlx_reference.greedy_tokens(llama_dir, prompt, 48)
    assert counts["preempted"] > 0


# Room for ~96 tokens of KV: ten growing requests must preempt each other.
_SMALL_POOL = dict(max_model_len=96, num_gpu_blocks_override=14, block_size=16)


@pytest.mark.parametrize("spec, message", [
    ({"method": "eagle3", "model": "TARGET", "num_speculative_tokens": 2}, "eagle3"),
    ({"method": "suffix", "num_speculative_tokens": 2}, "'suffix' is not supported"),
    ({"method": "ngram", "num_speculative_tokens": 64}, "num_speculative_tokens=64"),
    ({"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
      "synthetic_acceptance_length": 2.0}, "rejection_sample_method"),
])
def test_unsupported_configs_are_refused_by_name(llama_dir, spec, message):
    spec = {k: str(llama_dir) if v == "TARGET" else v for k, v in spec.items()}
    with pytest.raises(Exception, match=message):
        make_llm(llama_dir, speculative_config=spec)


def test_explicit_async_scheduling_is_refused(llama_dir):
    with pytest.raises(Exception, match="--async-scheduling"):
        make_llm(llama_dir, speculative_config=NGRAM, async_scheduling=True)


def test_recurrent_targets_are_refused():
    from tests.family_models import cached_family_model

    with pytest.raises(Exception, match="Lfm2ForCausalLM has recurrent layers"):
        make_llm(cached_family_model("lfm2"), speculative_config=NGRAM)


def _draft(model_dir, k=3):
    return {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": k}


@pytest.mark.parametrize("draft", ["self", "quantized", "other_shape"])
def test_draft_model_greedy_equals_mlx_lm(llama_dir, draft):
    """The target drafting for itself accepts every draft; a 4-bit copy of it and a
    one-layer model of another shape (its own cache geometry) accept some. Greedy
    tokens are mlx-lm's in every case, in a batch with chunked prompts and prefix hits."""
    from tests.tiny_models import cached_tiny_model

    draft_dir = {"self": llama_dir,
                 "quantized": cached_tiny_model("llama", quantize_bits=4),
                 "other_shape": cached_tiny_model("qwen3", num_hidden_layers=1, head_dim=128,
                                                  num_key_value_heads=1)}[draft]
    prompts = _prompts(llama_dir)
    (got, again), counts = _run_engine(
        llama_dir, [prompts, prompts[:3]], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        speculative_config=_draft(draft_dir), enable_prefix_caching=True,
        max_num_batched_tokens=64)
    for prompt, tokens in zip(prompts, got):
        assert tokens == mlx_reference.greedy_tokens(llama_dir, prompt, MAX_TOKENS)
    assert again == got[:3]
    assert counts["drafted"] > 0
    if draft == "self":
        assert counts["accepted"] == counts["drafted"]
    else:
        assert 0 < counts["accepted"] < counts["drafted"]


def test_draft_model_under_preemption(llama_dir):
    prompts = [p[:40] for p in _prompts(llama_dir)]
    (got,), counts = _run_engine(llama_dir, [prompts], SamplingParams(temperature=0.0,
                                                                      max_tokens=48),
                                 speculative_config=_draft(llama_dir), **_SMALL_POOL)
    for prompt, tokens in zip(prompts, got):
        assert tokens == mlx_reference.greedy_tokens(llama_dir, prompt, 48)
    assert counts["preempted"] > 0
    assert counts["accepted"] == counts["drafted"] > 0


def test_draft_of_another_vocabulary_is_refused(llama_dir):
    from tests.tiny_models import cached_tiny_model

    with pytest.raises(Exception, match="vocab"):
        make_llm(llama_dir, speculative_config=_draft(cached_tiny_model("llama",
                                                                        vocab_size=512)))


@pytest.mark.slow   # a server of its own: with the slow tests (.ci/run)
def test_vllm_serve_with_ngram_speaks_openai(llama_dir):
    """`vllm serve --speculative-config` answers the openai client with mlx-lm's greedy
    tokens, streamed or not, concurrently; /metrics counts drafts and acceptances;
    min_p (which vLLM leaves out of speculation) is a 400 and the server stays up."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import openai
    import requests

    from tests.e2e.server import VllmServer

    srv = VllmServer(str(llama_dir), "--max-model-len", "512", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny",
                     "--speculative-config", json.dumps(NGRAM))
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused")
        prompts = _prompts(llama_dir)

        def complete(prompt):
            out = client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                            temperature=0.0)
            return out.choices[0].text

        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(complete, prompts))
        for prompt, text in zip(prompts, texts):
            assert text == mlx_reference.greedy_text(llama_dir, prompt, 24)
        stream = client.completions.create(model="tiny", prompt=prompts[-1], max_tokens=24,
                                           temperature=0.0, stream=True)
        assert "".join(c.choices[0].text for c in stream) == texts[-1]
        with pytest.raises(openai.BadRequestError, match="min_p"):
            client.completions.create(model="tiny", prompt="a", max_tokens=4, extra_body={
                "min_p": 0.2})
        metrics = requests.get(srv.base_url + "/metrics", timeout=10).text
        accepted = [line for line in metrics.splitlines()
                    if line.startswith("vllm:spec_decode_num_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[-1]) > 0
        assert requests.get(srv.base_url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", ["exact", "default"])
def test_gguf_target_and_draft(tmp_path, monkeypatch, mode):
    """A .gguf file as draft model: vLLM is given its derived config directory and the
    worker loads the file; drafting for itself, every draft is accepted. With the fast
    path off the tokens are mlx-lm's (through our GGUF loader) greedy ones; in the
    default mode (int8 activations, fp16 KV cache) they are the same engine's without
    speculation: a verification row computes as a decode row does."""
    from tests.gguf_models import make_tiny_gguf

    if mode == "exact":
        monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "0")
    gguf = make_tiny_gguf(tmp_path / "model.gguf", "llama", "Q8_0")
    prompts = [mlx_reference.tokenize(gguf, t) for t in PROMPTS[:4]]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    (got,), counts = _run_engine(gguf, [prompts], params, speculative_config=_draft(gguf))
    if mode == "exact":
        want = [mlx_reference.greedy_tokens(gguf, prompt, 16) for prompt in prompts]
    else:
        (want,), _ = _run_engine(gguf, [prompts], params)
    assert got == want
    assert counts["accepted"] == counts["drafted"] > 0
