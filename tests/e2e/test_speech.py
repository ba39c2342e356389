"""Whisper through vLLM's encoder-decoder path (an audio clip as the encoder input, a
decoder prompt of task tokens), against transformers' own float32 Whisper of the same
tiny checkpoint: greedy tokens and their log-probabilities, a batch of clips, the
same clip alone and in a batch, and nothing kept of a finished request."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import make_llm
from tests.speech_models import ReferenceWhisper, cached_whisper_model, make_clip

MAX_TOKENS = 8
PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


@pytest.fixture(scope="module")
def model_dir():
    return cached_whisper_model()


@pytest.fixture(scope="module")
def reference(model_dir):
    return ReferenceWhisper(model_dir)


@pytest.fixture(scope="module")
def llm(model_dir):
    llm = make_llm(model_dir, max_model_len=64, max_num_seqs=4)
    yield llm
    del llm


def _prompt(clip, decoder: str = PROMPT) -> dict:
    return {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (clip, 16000)}},
            "decoder_prompt": decoder}


def _greedy(llm, prompts):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    return llm.generate(prompts, params, use_tqdm=False)


def _tokens_and_logprobs(output) -> tuple[list[int], list[float]]:
    completion = output.outputs[0]
    lps = [step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)]
    return list(completion.token_ids), lps


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def test_greedy_tokens_match_transformers(llm, reference):
    clips = [make_clip(seed) for seed in range(3)]
    outputs = _greedy(llm, [_prompt(c) for c in clips])
    seen = set()
    for output, clip in zip(outputs, clips):
        tokens, lps = _tokens_and_logprobs(output)
        want_tokens, want_lps = reference.greedy(output.prompt_token_ids, clip, MAX_TOKENS)
        assert tokens == want_tokens
        assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3, (lps, want_lps)
        seen.add(tuple(tokens))
    assert len(seen) > 1   # the clips are heard: different clips, different tokens


def test_translate_prompt_matches_transformers(llm, reference):
    clip = make_clip(7, seconds=2.0)
    output, = _greedy(llm, [_prompt(clip, "<|startoftranscript|><|fr|><|translate|>"
                                          "<|notimestamps|>")])
    tokens, lps = _tokens_and_logprobs(output)
    want_tokens, want_lps = reference.greedy(output.prompt_token_ids, clip, MAX_TOKENS)
    assert tokens == want_tokens
    assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3


def test_alone_and_in_a_batch_identical(llm):
    clips = [make_clip(seed) for seed in range(10, 14)]
    alone = _tokens_and_logprobs(_greedy(llm, [_prompt(clips[0])])[0])
    batch = _greedy(llm, [_prompt(c) for c in clips])
    assert _tokens_and_logprobs(batch[0]) == alone


def test_nothing_kept_after_requests(llm):
    _greedy(llm, [_prompt(make_clip(seed)) for seed in range(20, 23)])
    _greedy(llm, [_prompt(make_clip(30))])   # the next step drops the finished ones
    assert len(_runner(llm).audio) <= 1


def test_supported_task_is_transcription(llm):
    assert "transcription" in llm.llm_engine.get_supported_tasks()


def test_a_spoken_clip_matches_transformers(llm, reference):
    import io

    import numpy as np
    from vllm.multimodal.media.audio import load_audio

    from tests.speech_models import speech_clip

    samples, _ = load_audio(io.BytesIO(speech_clip().read_bytes()), sr=16000, mono=True)
    clip = np.asarray(samples, np.float32)
    output, = _greedy(llm, [_prompt(clip)])
    tokens, lps = _tokens_and_logprobs(output)
    want_tokens, want_lps = reference.greedy(output.prompt_token_ids, clip, MAX_TOKENS)
    assert tokens == want_tokens
    assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3
