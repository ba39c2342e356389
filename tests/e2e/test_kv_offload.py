"""KV offloading through vLLM's OffloadingConnector (--kv-offloading-size, and
--kv-transfer-config with vLLM's fs disk tier).

A pool too small to keep a long prefix loses it to other prompts; the prefix then
comes back from host memory, or from disk after the engine is gone, and greedy
tokens equal mlx-lm's own forward (and the run without offloading). The bytes
loaded are counted by vLLM's offload metrics, so a recompute cannot pass as a hit.
Configurations the runner cannot serve are refused by name.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm
from tests.family_models import cached_family_model

MAX_TOKENS = 12
BLOCK = 16
# A pool of 40 blocks holds the 13-block prefix, but not after four prompts of 19.
POOL = dict(num_gpu_blocks_override=40, block_size=BLOCK, max_model_len=512,
            disable_log_stats=False)


def _greedy(llm, prompts, max_tokens=MAX_TOKENS):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _metric(llm, name):
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def _block_bytes(llm):
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    return runner.kv_cache.nbytes // runner.kv_cache.num_blocks


def _prefix(llama_dir):
    text = " ".join(PROMPTS) * 3
    ids = mlx_reference.tokenize(llama_dir, text)
    assert len(ids) >= 210
    return ids[:210]


def _after_eviction(llm, prefix, rounds=4):
    """Prompts of other tokens take the whole pool in turn, then ``prefix`` is asked
    for again: -> (its greedy tokens, bytes loaded for it)."""
    for k in range(rounds):
        _greedy(llm, [[11 + k] * 300], 1)
    before = _metric(llm, "vllm:kv_offload_load_bytes")
    tokens = _greedy(llm, [prefix])
    return tokens, _metric(llm, "vllm:kv_offload_load_bytes") - before


def test_evicted_prefix_comes_back_from_host_memory(llama_dir):
    prefix = _prefix(llama_dir)
    prompts = [prefix + [42, 7], prefix]
    expected = [mlx_reference.greedy_tokens(llama_dir, p, MAX_TOKENS) for p in prompts]
    llm = make_llm(llama_dir, kv_offloading_size=0.05, **POOL)
    try:
        assert _greedy(llm, prompts[:1]) == expected[:1]
        stored = _metric(llm, "vllm:kv_offload_store_bytes")
        assert stored > 0, "the prompt's full blocks are offloaded as they fill"
        tokens, loaded = _after_eviction(llm, prompts[1])
        assert tokens == expected[1:]
        # The 13 full blocks of the prefix were loaded, not recomputed.
        assert loaded == 13 * _block_bytes(llm)
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "deepseek_v3"])
def test_other_cache_layouts_come_back_from_host_memory(family):
    # Sliding-window and full-attention groups sharing the pool's buffers (Gemma 3),
    # sinks (gpt-oss), and MLA's latent rows (DeepSeek V3).
    model_dir = cached_family_model(family)
    prefix = [(i * 7) % 200 + 5 for i in range(210)]
    expected = [mlx_reference.greedy_tokens(model_dir, prefix, MAX_TOKENS)]
    llm = make_llm(model_dir, kv_offloading_size=0.05,
                   **{**POOL, "num_gpu_blocks_override": 80})
    try:
        assert _greedy(llm, [prefix]) == expected
        tokens, loaded = _after_eviction(llm, prefix, rounds=8)
        assert tokens == expected and loaded > 0
    finally:
        del llm
        gc.collect()


def test_offloading_with_preemption_and_a_batch(llama_dir):
    # 8 requests share the prefix in a pool that holds two of them: requests are
    # preempted, their blocks flushed to the host tier and loaded back.
    prefix = _prefix(llama_dir)
    prompts = [prefix[:150] + [100 + i] * (i + 1) for i in range(8)]
    expected = [mlx_reference.greedy_tokens(llama_dir, p, 30) for p in prompts]
    llm = make_llm(llama_dir, kv_offloading_size=0.05, max_num_seqs=8,
                   max_num_batched_tokens=64,
                   **{**POOL, "num_gpu_blocks_override": 24, "max_model_len": 256})
    try:
        assert _greedy(llm, prompts, 30) == expected
        assert _metric(llm, "vllm:num_preemptions") > 0, "the pool was meant to preempt"
        assert _metric(llm, "vllm:kv_offload_store_bytes") > 0
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("flag", ["fp8", "turboquant_4bit_nc", "turboquant_k8v4"])
def test_quantized_cache_offloads_its_codes_and_scales(llama_dir, flag):
    prefix = _prefix(llama_dir)
    plain = make_llm(llama_dir, kv_cache_dtype=flag, **POOL)
    try:
        expected = _greedy(plain, [prefix])
    finally:
        del plain
        gc.collect()
    llm = make_llm(llama_dir, kv_cache_dtype=flag, kv_offloading_size=0.05, **POOL)
    try:
        _greedy(llm, [prefix])
        tokens, loaded = _after_eviction(llm, prefix)
        assert tokens == expected and loaded > 0
    finally:
        del llm
        gc.collect()


def _disk_config(root: Path) -> dict:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4 << 20,
                "secondary_tiers": [{"type": "fs", "root_dir": str(root),
                                     "n_read_threads": 2, "n_write_threads": 2}]}}


def _block_files(root: Path) -> int:
    return sum(1 for _ in root.rglob("*.bin"))


def _wait_for_files(root: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _block_files(root) < count:
        assert time.monotonic() < deadline, f"{_block_files(root)} of {count} blocks on disk"
        time.sleep(0.2)


def _serve_once_to_disk(model_dir, root: Path, prefix, **overrides):
    """One engine that computes ``prefix`` and is gone once its 13 blocks are on disk."""
    llm = make_llm(model_dir, kv_transfer_config=_disk_config(root), **POOL, **overrides)
    try:
        tokens = _greedy(llm, [prefix])
        _wait_for_files(root, 13)
    finally:
        del llm
        gc.collect()
    return tokens


def test_prefix_is_a_hit_from_disk_after_a_restart(llama_dir, tmp_path):
    prefix = _prefix(llama_dir)
    expected = [mlx_reference.greedy_tokens(llama_dir, prefix, MAX_TOKENS)]
    assert _serve_once_to_disk(llama_dir, tmp_path, prefix) == expected
    # A new engine: empty pool and host tier; the disk holds the prefix.
    llm = make_llm(llama_dir, kv_transfer_config=_disk_config(tmp_path), **POOL)
    try:
        assert _metric(llm, "vllm:kv_offload_load_bytes") == 0
        assert _greedy(llm, [prefix]) == expected
        assert _metric(llm, "vllm:kv_offload_load_bytes") == 13 * _block_bytes(llm)
    finally:
        del llm
        gc.collect()


def test_a_truncated_block_file_is_recomputed(llama_dir, tmp_path):
    # A file cut short (a full disk, a copy gone wrong) is a miss from that block on:
    # the blocks before it load, the rest are computed, the tokens stay right.
    prefix = _prefix(llama_dir)
    expected = [mlx_reference.greedy_tokens(llama_dir, prefix, MAX_TOKENS)]
    _serve_once_to_disk(llama_dir, tmp_path, prefix)
    files = sorted(tmp_path.rglob("*.bin"))
    victim = files[len(files) // 2]
    victim.write_bytes(victim.read_bytes()[:100])
    llm = make_llm(llama_dir, kv_transfer_config=_disk_config(tmp_path), **POOL)
    try:
        assert _greedy(llm, [prefix]) == expected
        assert _metric(llm, "vllm:kv_offload_load_bytes") < 13 * _block_bytes(llm)
    finally:
        del llm
        gc.collect()


def test_disk_blocks_of_another_layout_are_not_read(llama_dir, tmp_path):
    # The fp8 cache's bytes are not the float cache's: its blocks live under another
    # directory, and the float engine computes the prefix afresh.
    prefix = _prefix(llama_dir)
    _serve_once_to_disk(llama_dir, tmp_path, prefix, kv_cache_dtype="fp8")
    llm = make_llm(llama_dir, kv_transfer_config=_disk_config(tmp_path), **POOL)
    try:
        _greedy(llm, [prefix])
        assert _metric(llm, "vllm:kv_offload_load_bytes") == 0
        _wait_for_files(tmp_path, 26)  # its own blocks, beside the fp8 ones
        assert len(list(tmp_path.rglob("config.json"))) == 2
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("overrides,message", [
    (dict(kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_both"}),
     "KV connector ExampleConnector is not supported"),
    (dict(kv_offloading_size=1.0, kv_offloading_backend="lmcache"),
     "--kv-offloading-backend lmcache is not supported"),
    (dict(kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                              "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20,
                                                            "spec_name": "MySpec"}}),
     "offloading spec MySpec is not supported"),
])
def test_unsupported_transfer_configs_are_refused_by_name(llama_dir, overrides, message):
    with pytest.raises(Exception, match=message):
        make_llm(llama_dir, **overrides)


def test_a_hybrid_with_recurrent_state_is_refused_with_offloading():
    with pytest.raises(Exception, match="KV offloading: .* keeps recurrent state"):
        make_llm(cached_family_model("qwen3_next"), kv_offloading_size=0.05)


def test_a_draft_model_is_refused_with_offloading(llama_dir):
    with pytest.raises(Exception, match="speculative method draft_model is not supported"):
        make_llm(llama_dir, kv_offloading_size=0.05, speculative_config={
            "method": "draft_model", "model": str(llama_dir), "num_speculative_tokens": 2})
