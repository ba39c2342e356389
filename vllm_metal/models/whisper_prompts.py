"""Whisper's decoder prompts for the transcription API, as OpenAI's Whisper and
transformers build them.

vLLM's Whisper prompt differs from them in two ways this module mends:
- The request's ``prompt`` (earlier text, to keep names and style) goes after
  ``<|prev|>``, a token Whisper's vocabulary lacks: it is read as five text pieces.
  Whisper's token is ``<|startofprev|>``, followed by the text with one leading space
  (transformers' ``get_prompt_ids``), of which the last 223 tokens are kept (OpenAI's
  ``n_text_ctx // 2 - 1``: half of the 448 positions stay for the transcript).
- English-only checkpoints (``*.en``) were trained without the language and task
  tokens: given them, tiny.en answers ``<|endoftext|>`` at once (an empty
  transcript), where ``<|startoftranscript|><|notimestamps|>`` gives the words. They
  are told apart by their vocabulary: 51864 tokens (tiny.en to medium.en,
  distil-whisper's .en), where the multilingual ones have 51865 or 51866; any other
  size (a test's or a custom tokenizer's) is taken as multilingual. For them the
  language is English (another one asked is refused), vLLM's language detection is
  skipped, and a translation is refused (HTTP 400).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config.speech_to_text import SpeechToTextParams

# The English-only checkpoints' vocabulary (OpenAI's GPT-2 based tokens, no language
# tokens beyond those the .en models were never prompted with).
ENGLISH_ONLY_VOCAB = 51864
# Tokens of earlier text kept before the transcript (OpenAI's n_text_ctx // 2 - 1).
MAX_PREVIOUS_TOKENS = 223
# vLLM's own language attributes of its Whisper class (kept for a multilingual one),
# saved when the class is first changed.
_VLLMS: dict = {}


def english_only(hf_config) -> bool:
    return (getattr(hf_config, "model_type", None) == "whisper"
            and getattr(hf_config, "vocab_size", None) == ENGLISH_ONLY_VOCAB)


def use_whisper_prompts(hf_config) -> None:
    """For a process serving a Whisper checkpoint (the last one configured, as a
    server has one): vLLM's Whisper prompts come from ``decoder_prompt``. For an
    English-only one, the language is checked by ``_english`` and vLLM's language
    detection is skipped: it restricts the first token to language tokens such a
    tokenizer lacks (they map to ``<|endoftext|>``, and vLLM's parser then fails the
    request: a 500); a multilingual one keeps vLLM's."""
    import inspect

    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration as whisper

    if not _VLLMS:
        _VLLMS.update(detect=whisper.supports_explicit_language_detection,
                      validate=inspect.getattr_static(whisper, "validate_language"))
        whisper.get_generation_prompt = classmethod(_generation_prompt)
        _keep_prompts_with_their_own_start()
    english = english_only(hf_config)
    whisper.supports_explicit_language_detection = False if english else _VLLMS["detect"]
    whisper.validate_language = classmethod(_english) if english else _VLLMS["validate"]


def _generation_prompt(cls, stt_params: SpeechToTextParams):
    from vllm.inputs import ExplicitEncoderDecoderPrompt, TextPrompt

    audio = (stt_params.audio, stt_params.stt_config.sample_rate)
    return ExplicitEncoderDecoderPrompt(
        encoder_prompt=TextPrompt(prompt="", multi_modal_data={"audio": audio}),
        decoder_prompt=TextPrompt(prompt=decoder_prompt(stt_params)))


def _keep_prompts_with_their_own_start() -> None:
    """vLLM puts the decoder start token (``<|startoftranscript|>``) before any decoder
    prompt that does not begin with it, as transformers' generic generate does. A
    prompt with earlier text begins with ``<|startofprev|>`` and holds the start token
    after that text (transformers' Whisper and OpenAI's put nothing before it): a
    second start token in front made tiny.en answer ``<|endoftext|>`` at once."""
    import vllm.inputs.engine as engine

    vllms = engine._prepare_decoder_input_ids_for_generation

    def prepare(decoder_input_ids: list[int], decoder_start_token_id: int) -> list[int]:
        if decoder_start_token_id in decoder_input_ids[1:]:
            return decoder_input_ids
        return vllms(decoder_input_ids, decoder_start_token_id)

    engine._prepare_decoder_input_ids_for_generation = prepare


def _english(cls, language: str | None) -> str:
    """An English-only checkpoint's language: English when none is asked (the answer
    names it), a ValueError (HTTP 400) for any other."""
    if language in (None, "en"):
        return "en"
    raise ValueError(f"language {language!r}: this Whisper checkpoint is English-only (a "
                     "*.en model); send language 'en' or none, or serve a multilingual "
                     "checkpoint")


def decoder_prompt(stt_params: SpeechToTextParams) -> str:
    """The decoder's text: ``<|startofprev|>`` and the request's prompt (when given),
    then ``<|startoftranscript|>``, the language and task (multilingual checkpoints),
    ``<|notimestamps|>``."""
    from vllm.exceptions import VLLMValidationError

    config = stt_params.model_config
    start = "<|startoftranscript|>"
    if english_only(config.hf_config):
        if stt_params.task_type != "transcribe":
            # A client error (HTTP 400), not a ValueError, which the route answers
            # with 500.
            raise VLLMValidationError(
                "this Whisper checkpoint is English-only (a *.en model): it transcribes "
                "English and does not translate; use a multilingual checkpoint for "
                "/v1/audio/translations", parameter="model", value=config.model)
    else:
        if stt_params.language is None:   # vLLM detects or defaults it before this
            raise ValueError("Language must be specified when creating the Whisper prompt")
        start += f"<|{stt_params.language}|><|{stt_params.task_type}|>"
    return _previous(stt_params) + start + "<|notimestamps|>"


def _previous(stt_params: SpeechToTextParams) -> str:
    """``<|startofprev|>`` and the request's prompt (its last MAX_PREVIOUS_TOKENS tokens),
    or "" without one."""
    text = (stt_params.request_prompt or "").strip()
    if not text:
        return ""
    from vllm.tokenizers.registry import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(stt_params.model_config)
    ids = tokenizer.encode(" " + text, add_special_tokens=False)
    special = set(tokenizer.get_added_vocab().values())
    if any(i in special for i in ids):
        from vllm.exceptions import VLLMValidationError

        # Such text would steer the decoder (a <|startoftranscript|> of its own, a
        # language, timestamps), as transformers' get_prompt_ids also refuses.
        raise VLLMValidationError(
            "prompt: Whisper's special tokens (<|...|>) cannot be part of the prompt; "
            "send plain text", parameter="prompt", value=text[:80])
    if len(ids) > MAX_PREVIOUS_TOKENS:
        text = tokenizer.decode(ids[-MAX_PREVIOUS_TOKENS:])
    else:
        text = " " + text
    return "<|startofprev|>" + text
