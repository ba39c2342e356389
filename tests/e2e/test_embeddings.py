"""Embeddings from a pooling engine (`--runner pooling`) against transformers' own
forward of the same checkpoint, pooled in float64: last-token pooling normalised (a
Qwen3-Embedding-shaped checkpoint), mean pooling not normalised (a bare decoder
saved as transformers saves an AutoModel, without the LM head), per-token
embeddings, chunked prompts, prefix-cache hits and batch invariance."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import PROMPTS, make_llm
from tests.pooling_models import ReferenceEmbedder, cached_embedding_model, cosine

# A prompt longer than the chunk of the chunked engine below (about 150 tokens).
LONG = " ".join(PROMPTS) * 2


@pytest.fixture(scope="module")
def last_dir():
    return cached_embedding_model("qwen3", pooling="last", normalize=True)


@pytest.fixture(scope="module")
def mean_dir():
    return cached_embedding_model("llama", pooling="mean", normalize=False, bare=True)


@pytest.fixture(scope="module")
def last_llm(last_dir):
    llm = make_llm(last_dir, runner="pooling")
    yield llm
    del llm


def _embeddings(outputs) -> list[np.ndarray]:
    return [np.array(o.outputs.embedding, dtype=np.float64) for o in outputs]


def test_the_engine_reports_the_embedding_tasks(last_llm):
    assert set(last_llm.supported_tasks) == {"embed", "token_embed"}


def test_last_token_embeddings_match_transformers(last_llm, last_dir):
    ref = ReferenceEmbedder(last_dir)
    outputs = last_llm.embed([*PROMPTS, LONG])
    for out, got in zip(outputs, _embeddings(outputs)):
        want = ref.embed(out.prompt_token_ids, "last", normalize=True)
        assert cosine(got, want) > 0.9999
        np.testing.assert_allclose(got, want, atol=2e-4)
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5


def test_an_embedding_is_the_same_alone_and_in_a_batch(last_llm):
    batch = _embeddings(last_llm.embed(PROMPTS))
    for prompt, together in zip(PROMPTS[:3], batch):
        alone, = _embeddings(last_llm.embed([prompt]))
        np.testing.assert_array_equal(alone, together)


def test_a_prefix_cache_hit_gives_the_same_embedding(last_llm):
    first, = _embeddings(last_llm.embed([LONG]))
    again, = _embeddings(last_llm.embed([LONG]))   # its blocks are cached by now
    np.testing.assert_array_equal(first, again)


def test_per_token_embeddings_match_transformers_in_chunks_too(last_dir):
    # Chunks of 32 tokens: a long prompt's states are gathered across steps.
    llm = make_llm(last_dir, runner="pooling", pooler_config={"task": "token_embed"},
                   max_num_batched_tokens=32, enable_chunked_prefill=True)
    ref = ReferenceEmbedder(last_dir)
    outputs = llm.encode([*PROMPTS[:3], LONG], pooling_task="token_embed")
    assert len(outputs[-1].prompt_token_ids) > 3 * 32
    for out in outputs:
        got = out.outputs.data.double().numpy()
        want = ref.hidden(out.prompt_token_ids)
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-4)


def test_mean_pooling_of_a_bare_decoder_matches_transformers(mean_dir):
    llm = make_llm(mean_dir, runner="pooling")
    assert llm.llm_engine.model_config.pooler_config.seq_pooling_type == "MEAN"
    ref = ReferenceEmbedder(mean_dir)
    outputs = llm.embed(PROMPTS)
    for out, got in zip(outputs, _embeddings(outputs)):
        want = ref.embed(out.prompt_token_ids, "mean", normalize=False)
        assert cosine(got, want) > 0.9999
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def test_a_prompt_in_chunks_pools_as_one(last_dir, last_llm):
    whole, = _embeddings(last_llm.embed([LONG]))
    chunked = make_llm(last_dir, runner="pooling", max_num_batched_tokens=32,
                       enable_chunked_prefill=True, enable_prefix_caching=False)
    out, = chunked.embed([LONG])
    assert len(out.prompt_token_ids) > 3 * 32
    np.testing.assert_array_equal(np.array(out.outputs.embedding, np.float64), whole)


def test_no_request_state_outlives_its_request(last_dir):
    """Pooling inputs (params, chunk states, prompts) leave with their requests, a
    chunked token_embed's gathered states included: vLLM names a step's finished
    requests in the next step, so what stays is the last round's, never an earlier's."""
    llm = make_llm(last_dir, runner="pooling", pooler_config={"task": "token_embed"},
                   max_num_batched_tokens=32, enable_chunked_prefill=True)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    rounds = [{o.request_id for o in llm.encode([*PROMPTS, LONG], pooling_task="token_embed")}
              for _ in range(3)]
    pooling = runner.pooling
    for held in (pooling._params, pooling._states, pooling._prompts, runner.input_batch.requests):
        assert {r.split("-")[0] for r in held} <= rounds[-1]


def test_a_lora_adapter_embeds_as_its_merged_checkpoint(tmp_path):
    """--enable-lora on an embedding model: a request's adapter gives the embeddings of
    the checkpoint with that adapter merged into its weights (float64 merge)."""
    from vllm.lora.request import LoRARequest

    from tests.lora_adapters import merged_checkpoint, random_updates, write_peft
    from tests.pooling_models import make_embedding_model

    base = make_embedding_model(tmp_path / "base", "llama", pooling="last", normalize=True)
    updates = random_updates(base, rank=8)
    adapter = write_peft(tmp_path / "adapter", updates, rank=8, alpha=16)
    merged = merged_checkpoint(base, updates, 2.0, tmp_path / "merged")
    assert (merged / "1_Pooling").is_dir()   # the copy keeps the pooling files
    served = make_llm(base, runner="pooling", enable_lora=True, max_lora_rank=8)
    lora = LoRARequest("adapter", 1, str(adapter))
    got = _embeddings(served.embed(PROMPTS[:4], lora_request=lora))
    plain = _embeddings(served.embed(PROMPTS[:4]))
    del served
    want = _embeddings(make_llm(merged, runner="pooling").embed(PROMPTS[:4]))
    for g, p, w in zip(got, plain, want):
        assert cosine(g, w) > 0.9999
        assert cosine(p, w) < 0.99   # the adapter changes them


@pytest.mark.slow
def test_two_tensor_ranks_embed_as_one(last_dir, last_llm):
    """--tensor-parallel-size 2 (each rank a share of the heads and MLP columns,
    gathered): the same embeddings, bit for bit, as one rank."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    one = _embeddings(last_llm.embed(PROMPTS[:3]))
    script = textwrap.dedent(f"""
        import json
        from vllm import LLM
        llm = LLM(model={str(last_dir)!r}, runner="pooling", max_model_len=512,
                  gpu_memory_utilization=0.3, tensor_parallel_size=2)
        out = llm.embed({PROMPTS[:3]!r}, use_tqdm=False)
        print("EMBEDDINGS" + json.dumps([o.outputs.embedding for o in out]))
    """)
    # The ranks are processes of their own: the engine too, as vllm serve runs it.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=env)
    line = next((x for x in run.stdout.splitlines() if x.startswith("EMBEDDINGS")), None)
    assert line is not None, run.stdout[-3000:] + run.stderr[-3000:]
    two = [np.array(v, np.float64) for v in json.loads(line.removeprefix("EMBEDDINGS"))]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
