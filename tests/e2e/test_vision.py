"""Vision-language models through vLLM's multimodal input path, against transformers'
own float32 forward of the same tiny checkpoint: greedy tokens and their
log-probabilities, one and two images, a placeholder span split across prompt
chunks, a prefix-cache hit (keyed by the image, not the text), batch invariance,
and no encoder output kept for a finished request."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import make_llm
from tests.vlm_models import KINDS, ReferenceVLM, cached_vlm_model, make_image

MAX_TOKENS = 8


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(kind):
    return cached_vlm_model(kind)


@pytest.fixture(scope="module")
def reference(model_dir):
    return ReferenceVLM(model_dir)


@pytest.fixture(scope="module")
def llm(model_dir):
    llm = make_llm(model_dir, enable_prefix_caching=True)
    yield llm
    del llm


def _chat(text: str, *images) -> list[dict]:
    parts = [{"type": "image_pil", "image_pil": image} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _greedy(llm, conversations):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    return llm.chat(conversations, params, use_tqdm=False)


def _tokens_and_logprobs(output) -> tuple[list[int], list[float]]:
    completion = output.outputs[0]
    lps = [step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)]
    return list(completion.token_ids), lps


def _check(reference, output, images) -> None:
    tokens, lps = _tokens_and_logprobs(output)
    want_tokens, want_lps = reference.greedy(output.prompt_token_ids, images, MAX_TOKENS)
    assert tokens == want_tokens
    assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3, (lps, want_lps)


def test_greedy_tokens_match_transformers(llm, reference):
    cats, dogs = make_image(1), make_image(2, (64, 30))
    outputs = _greedy(llm, [_chat("What is in the picture?", cats),
                            _chat("Describe it.", dogs)])
    for output, image in zip(outputs, (cats, dogs)):
        _check(reference, output, [image])


def test_two_images_in_one_prompt_match_transformers(llm, reference):
    first, second = make_image(3), make_image(4, (30, 50))
    output, = _greedy(llm, [_chat("Compare them.", first, second)])
    _check(reference, output, [first, second])


def test_the_image_changes_the_answer_and_a_cache_hit_keeps_it(llm, reference):
    text = "What is in the picture?"
    first, = _greedy(llm, [_chat(text, make_image(5))])
    again, = _greedy(llm, [_chat(text, make_image(5))])   # the same picture: a prefix hit
    other, = _greedy(llm, [_chat(text, make_image(6))])   # same text, another picture
    assert again.num_cached_tokens > 0
    assert _tokens_and_logprobs(again) == _tokens_and_logprobs(first)
    assert other.num_cached_tokens < len(other.prompt_token_ids) // 2 + 16
    assert _tokens_and_logprobs(other)[0] != _tokens_and_logprobs(first)[0]
    _check(reference, other, [make_image(6)])


def test_a_request_is_the_same_alone_and_in_a_batch(model_dir):
    # Without prefix caching: a rerun's prompt is computed as the batch computed it.
    llm = make_llm(model_dir, enable_prefix_caching=False)
    chats = [_chat(f"Picture {i}?", make_image(10 + i)) for i in range(4)]
    together = [_tokens_and_logprobs(o) for o in _greedy(llm, chats)]
    for chat, want in zip(chats[:2], together):
        alone, = _greedy(llm, [chat])
        assert _tokens_and_logprobs(alone) == want


def test_an_image_split_across_prompt_chunks_matches_transformers(kind, model_dir, reference):
    # Chunks of 8 tokens: every image's placeholder span is cut into several steps,
    # except Gemma 3's: its image tokens attend to the whole image, so vLLM schedules
    # an image in one step and the chunk before it stops short of it. Its budget must
    # hold the image's whole placeholder (16 image tokens and the newlines and markers
    # around them): vLLM refuses fewer than 16 by name, and between 16 and the
    # placeholder's length its scheduler never schedules the image.
    budget = 24 if kind == "gemma3" else 8
    llm = make_llm(model_dir, max_num_batched_tokens=budget, enable_chunked_prefill=True,
                   enable_prefix_caching=False)
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_batched_tokens == budget
    assert scheduler.disable_chunked_mm_input == (kind == "gemma3")
    image = make_image(7, (112, 112))
    output, = _greedy(llm, [_chat("What is in the picture? " * 3, image)])
    assert output.prompt_token_ids.count(_image_token(model_dir)) > 8
    assert len(output.prompt_token_ids) > 2 * scheduler.max_num_batched_tokens
    _check(reference, output, [image])


def test_gemma3_image_tokens_attend_to_the_whole_image(kind, llm, reference):
    # The parity tests see causal attention over an image: without the key ends
    # (each image row attending to its whole image) Gemma 3's log-probabilities move.
    if kind != "gemma3":
        pytest.skip("Gemma 3 only: the other kinds attend causally over images")
    runner = _runner(llm)
    assert runner.bidirectional_images
    image = make_image(8)
    want = reference.greedy(_greedy(llm, [_chat("Look.", image)])[0].prompt_token_ids,
                            [image], MAX_TOKENS)
    runner.bidirectional_images = False
    try:
        llm.llm_engine.reset_prefix_cache()
        causal, = _greedy(llm, [_chat("Look.", image)])
    finally:
        runner.bidirectional_images = True
    tokens, lps = _tokens_and_logprobs(causal)
    assert tokens != want[0] or max(abs(a - b) for a, b in zip(lps, want[1])) > 1e-2


def test_nothing_of_a_finished_request_is_kept(model_dir, reference):
    # Room for two images' outputs: vLLM's scheduler evicts, the runner follows.
    llm = make_llm(model_dir, max_num_batched_tokens=32, enable_chunked_prefill=True)
    manager = llm.llm_engine.engine_core.engine_core.scheduler.encoder_cache_manager
    cache = _runner(llm).encoder_cache
    # 16 image tokens each (LLaVA's fixed count; Qwen's 112 x 112 pictures).
    images = [make_image(20 + i, (112, 112)) for i in range(manager.cache_size // 16 + 3)]
    for image in images:
        output, = _greedy(llm, [_chat("What now?", image)])
        assert set(cache.outputs) <= set(manager.cached)
        assert sum(o.shape[0] for o in cache.outputs.values()) <= manager.cache_size
    assert len(cache.outputs) < len(images)   # some were evicted
    _check(reference, output, [images[-1]])
    # vLLM names finished requests with the next step.
    _greedy(llm, [[{"role": "user", "content": "Text only."}]])
    assert cache.features == {}
    positions = _runner(llm).rope_positions
    if positions is not None:   # M-RoPE: a text request keeps none
        assert positions.prompt == {} and positions.delta == {}
    llm.llm_engine.reset_encoder_cache()
    assert cache.outputs == {}


def _image_token(model_dir) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return getattr(config, "image_token_index", None) or config.image_token_id


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_two_ranks_give_one_ranks_tokens(flag, llm, kind, model_dir):
    # Each rank encodes the images itself (vLLM sends every rank the schedule).
    chats = [_chat("What is in the picture?", make_image(40, (112, 112))),
             _chat("Describe it.", make_image(41, (84, 56)))]
    want = [_tokens_and_logprobs(o)[0] for o in _greedy(llm, chats)]
    script = (
        "import json, sys\n"
        "from tests.e2e.conftest import make_llm\n"
        "from tests.e2e import test_vision as tv\n"
        "from tests.vlm_models import make_image\n"
        f"llm = make_llm({str(model_dir)!r}, {flag}=2, distributed_executor_backend='mp')\n"
        "chats = [tv._chat('What is in the picture?', make_image(40, (112, 112))),\n"
        "         tv._chat('Describe it.', make_image(41, (84, 56)))]\n"
        "print('TOKENS', json.dumps([tv._tokens_and_logprobs(o)[0] "
        "for o in tv._greedy(llm, chats)]))\n")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=env)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("TOKENS ")), None)
    assert line is not None, run.stderr[-3000:]
    assert json.loads(line.removeprefix("TOKENS ")) == want
