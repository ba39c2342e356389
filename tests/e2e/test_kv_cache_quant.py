"""``--kv-cache-dtype fp8 / fp8_e4m3 / fp8_e5m2 / int8_per_token_head /
turboquant_4bit_nc / turboquant_k8v4`` through vllm.LLM.

Greedy tokens equal mlx-lm's own forward with keys and values rounded the same way
(kv_quant_reference: the numpy codec, not our kernels), with batching, a prefix
cache hit and preemption; the bundled model stays reproducible alone and in a batch
on the default (int8) path; models the quantized cache cannot serve are refused by
name. test_kv_cache_quant_accuracy holds the real model's KL to a bound.
"""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm
from tests.e2e.kv_quant_reference import rounding_kv
from tests.family_models import cached_family_model
from vllm_metal.attention.kv_quant import FORMATS

FLAGS = {"fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "int8_per_token_head": "int8",
         "turboquant_4bit_nc": "rot4", "turboquant_k8v4": "k8v4"}
MAX_TOKENS = 24


def _greedy(llm, prompt_ids, max_tokens=MAX_TOKENS):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in prompt_ids], params,
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _reference(model_dir, prompt_ids, fmt, max_tokens=MAX_TOKENS):
    with rounding_kv(fmt):
        return [mlx_reference.greedy_tokens(model_dir, ids, max_tokens) for ids in prompt_ids]


@pytest.mark.parametrize("flag", list(FLAGS))
def test_greedy_matches_mlx_lm_with_the_same_rounding(llama_dir, flag):
    ids = [mlx_reference.tokenize(llama_dir, p) for p in PROMPTS]
    llm = make_llm(llama_dir, kv_cache_dtype=flag)
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        cache = runner.kv_cache.key_caches[0]
        head_dim = runner.loaded.dims.head_dim
        quant = FORMATS[FLAGS[flag]]
        assert cache.dtype == mx.uint8 and cache.shape[-1] == quant.key_width(head_dim)
        assert runner.kv_cache.value_caches[0].shape[-1] == quant.value_width(head_dim)
        assert runner.loaded.backbone.stack is not None  # the one-node stack writes and reads it
        expected = _reference(llama_dir, ids, FLAGS[flag])
        assert _greedy(llm, ids) == expected
        # A prefix-cache hit reads the blocks the first call wrote.
        base = ids[5]
        assert _greedy(llm, [base + ids[1][:3], base]) == _reference(
            llama_dir, [base + ids[1][:3], base], FLAGS[flag])
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("flag", ["fp8", "turboquant_4bit_nc"])
def test_preemption_and_chunked_prefill(llama_dir, flag):
    ids = [mlx_reference.tokenize(llama_dir, p) for p in PROMPTS[:6]]
    llm = make_llm(llama_dir, kv_cache_dtype=flag, max_model_len=96, num_gpu_blocks_override=14,
                   block_size=16, max_num_seqs=8, max_num_batched_tokens=16,
                   disable_log_stats=False)
    try:
        before = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        assert _greedy(llm, ids, 40) == _reference(llama_dir, ids, FLAGS[flag], 40)
        after = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        assert after > before, "the pool was meant to force preemption"
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("flag", ["fp8", "turboquant_4bit_nc", "turboquant_k8v4"])
def test_bundled_model_is_reproducible_alone_and_in_a_batch(flag):
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    prompts = [f"Summarise in one sentence: {p}" for p in PROMPTS]
    llm = make_llm(DEFAULT_MODEL.path(), kv_cache_dtype=flag, max_model_len=1024)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=48)
        alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids
                 for p in prompts]
        batch = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        reverse = [o.outputs[0].token_ids
                   for o in llm.generate(prompts[::-1], params, use_tqdm=False)][::-1]
        assert alone == batch == reverse
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("family,why", [("deepseek_v3", "multi-head latent attention"),
                                        ("qwen3_next", "recurrent state")])
def test_models_the_quantized_cache_cannot_serve_are_refused(family, why):
    with pytest.raises(Exception, match=f"--kv-cache-dtype fp8.*{why}"):
        make_llm(cached_family_model(family), kv_cache_dtype="fp8")


def test_unknown_quantized_dtype_is_refused_by_name(llama_dir):
    with pytest.raises(Exception, match="--kv-cache-dtype nvfp4 is not supported"):
        make_llm(llama_dir, kv_cache_dtype="nvfp4")
    for preset in ("turboquant_k3v4_nc", "turboquant_3bit_nc"):
        with pytest.raises(Exception, match=f"{preset} is not supported: .*kv-cache.md"):
            make_llm(llama_dir, kv_cache_dtype=preset)


def test_skip_layers_are_refused_beyond_vllm_s_boundary_layers(llama_dir):
    # Every layer's cache has the flag's format here: a layer asked to stay in
    # float is refused by name. (vLLM adds a turboquant run's boundary layers
    # itself; those are coded with a warning, as the turboquant tests above run.)
    with pytest.raises(Exception, match="--kv-cache-dtype-skip-layers 1: vllm-metal codes"):
        make_llm(llama_dir, kv_cache_dtype="fp8", kv_cache_dtype_skip_layers=["1"])


def test_ngram_speculation_over_a_quantized_cache(llama_dir):
    # Verification reads the drafts' keys back from the quantized cache: greedy
    # tokens equal the same cache without speculation. A draft model is refused.
    prompt = "one two three four one two three four one two three"
    params = SamplingParams(temperature=0.0, max_tokens=24)
    llm = make_llm(llama_dir, kv_cache_dtype="fp8", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    try:
        spec = list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
    finally:
        del llm
        gc.collect()
    llm = make_llm(llama_dir, kv_cache_dtype="fp8")
    try:
        plain = list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
    finally:
        del llm
        gc.collect()
    assert spec == plain
    with pytest.raises(Exception, match="draft_model drafter keeps a float cache"):
        make_llm(llama_dir, kv_cache_dtype="fp8", speculative_config={
            "method": "draft_model", "model": str(llama_dir), "num_speculative_tokens": 2})
