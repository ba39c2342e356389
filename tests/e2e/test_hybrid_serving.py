"""Hybrid models (Gated DeltaNet or Mamba2 layers beside full-attention ones) through vllm.LLM:
prefix caching off unless asked; asked, vLLM's align mode saves each request's
recurrent state at block boundaries, and a request that resumes from a cached
prefix gives mlx-lm's tokens and logprobs (so the same as a cold run).

Batching, chunked prefill and preemption of these families are in
test_family_parity.py (the hybrids are in its matrix).
"""

import gc

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import make_llm
from tests.e2e.test_family_parity import MAX_TOKENS, TOP_LOGPROBS, _check
from tests.family_models import cached_family_model

HYBRIDS = ["qwen3_next", "qwen3_5"]
# Mamba2 mixers (the linear gated rule): between attention layers, or beside them.
MAMBA2 = ["nemotron_h", "granitemoehybrid", "falcon_h1"]
# Over 100+ prompt tokens of float32 recurrence, mlx-lm's dense forward and the paged
# one sum in different orders: a top-k logprob near -20 then differs by ~1e-4 of itself.
RTOL = 2e-4
PREFIX = ("Tell me about the history of the city and its people, who have lived there for "
          "many generations and built houses of stone and wood along the river. ") * 3


def _metric(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


@pytest.mark.parametrize("family", HYBRIDS)
def test_prefix_caching_off_unless_asked(family):
    llm = make_llm(cached_family_model(family), max_model_len=256)
    try:
        assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False
        # The memory budget's max-length request: 8 blocks of 32 tokens in each of the
        # 2 attention layers, one state block in each of the 2 GDN layers.
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        page = runner.kv_bytes_per_block() // 4
        assert runner.block_size == 32
        assert runner.kv_bytes_per_request() == page * (2 * 8 + 2 * 1)
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("family", HYBRIDS + MAMBA2)
def test_prefix_hit_equals_mlx_lm_and_cold(family):
    model_dir = cached_family_model(family)
    prefix = mlx_reference.tokenize(model_dir, PREFIX)
    first = prefix + mlx_reference.tokenize(model_dir, " The bridge")
    second = prefix + mlx_reference.tokenize(model_dir, " In winter the river")
    # Blocks of 32 tokens, as a real hybrid's blocks are larger than vLLM's 16-token
    # hash blocks (Nemotron-H's tiny state would fit 16, where vLLM 0.33's align mode
    # finds no hit: measured, it caches no boundary state the lookup matches).
    llm = make_llm(model_dir, max_model_len=512, max_num_batched_tokens=32, block_size=32,
                   enable_prefix_caching=True, disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_LOGPROBS)

    def run(engine, ids):
        return engine.generate([TokensPrompt(prompt_token_ids=ids)], params,
                               use_tqdm=False)[0].outputs[0]
    try:
        config = llm.llm_engine.vllm_config.cache_config
        assert config.mamba_cache_mode == "align"
        block = config.block_size
        assert len(prefix) > 2 * block, "the prefix must fill blocks to be cached"
        _check(model_dir, first, run(llm, first), rtol=RTOL)
        hits = _metric(llm, "vllm:prefix_cache_hits")
        hit = run(llm, second)
        assert _metric(llm, "vllm:prefix_cache_hits") - hits >= block * (len(prefix) // block - 1)
        _check(model_dir, second, hit, rtol=RTOL)
        assert llm.reset_prefix_cache()
        hits = _metric(llm, "vllm:prefix_cache_hits")
        cold = run(llm, second)
        assert _metric(llm, "vllm:prefix_cache_hits") == hits
        assert cold.token_ids == hit.token_ids
        assert [{t: lp.logprob for t, lp in step.items()} for step in cold.logprobs] == \
            [{t: lp.logprob for t, lp in step.items()} for step in hit.logprobs]
    finally:
        del llm
        gc.collect()


# Servers of their own: with the slow tests (.ci/run); the README suite runs the
# hybrids in process.
@pytest.mark.slow
@pytest.mark.parametrize("family", HYBRIDS + MAMBA2[:1])
def test_vllm_serve_with_openai_client(family):
    """`vllm serve` of the checkpoint with the openai client: four concurrent greedy
    completions in 32-token chunks, each mlx-lm's tokens, and streamed as not."""
    import concurrent.futures

    import openai

    from tests.e2e.conftest import PROMPTS
    from tests.e2e.server import VllmServer

    model_dir = cached_family_model(family)
    srv = VllmServer(str(model_dir), "--max-model-len", "256", "--max-num-seqs", "4",
                     "--max-num-batched-tokens", "32", "--gpu-memory-utilization", "0.3",
                     "--served-model-name", "hybrid")
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
        prompts = [mlx_reference.tokenize(model_dir, p) for p in PROMPTS[:4]]

        def complete(ids, stream=False):
            resp = client.completions.create(model="hybrid", prompt=ids, max_tokens=MAX_TOKENS,
                                             temperature=0, stream=stream,
                                             extra_body={"return_token_ids": True})
            if stream:
                return "".join(c.choices[0].text for c in resp)
            return resp.choices[0].text, resp.choices[0].token_ids

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(complete, prompts))
        for ids, (text, tokens) in zip(prompts, results):
            assert tokens == mlx_reference.greedy_tokens(model_dir, ids, MAX_TOKENS)
            assert complete(ids, stream=True) == text
    finally:
        srv.stop()


@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h"])
def test_chunked_recurrence_matches_mlx_lm(family, monkeypatch):
    """VLLM_METAL_GDN_PREFILL_CHUNK=32: prompts of 100+ tokens run the chunked form of
    the gated rule (the delta rule for Qwen3-Next, the linear one for Nemotron-H) in
    steps of up to 96 rows, batched with decode rows: mlx-lm's tokens and logprobs."""
    from tests.e2e.conftest import PROMPTS

    from vllm_metal.ops import gdn

    monkeypatch.setenv("VLLM_METAL_GDN_PREFILL_CHUNK", "32")
    chunked_rows = []
    run = gdn.gated_delta

    def recording(q, *args, chunk=0, **kwargs):
        if chunk:
            chunked_rows.append(q.shape[0])
        return run(q, *args, chunk=chunk, **kwargs)

    monkeypatch.setattr(gdn, "gated_delta", recording)
    model_dir = cached_family_model(family)
    prefix = mlx_reference.tokenize(model_dir, PREFIX)
    ids = [prefix + mlx_reference.tokenize(model_dir, p) for p in PROMPTS[:3]]
    ids.append(mlx_reference.tokenize(model_dir, PROMPTS[3]))
    llm = make_llm(model_dir, max_model_len=512, max_num_batched_tokens=96)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_LOGPROBS)
    try:
        outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params,
                            use_tqdm=False)
        for prompt_ids, out in zip(ids, outs):
            _check(model_dir, prompt_ids, out.outputs[0], rtol=RTOL)
        assert max(chunked_rows) > 64, "steps of several chunks were meant to run"
    finally:
        del llm
        gc.collect()
