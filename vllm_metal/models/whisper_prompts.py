"""Decoder prompts of English-only Whisper checkpoints (``*.en``).

vLLM's Whisper prompt always names a language and a task
(``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``). The English-only
checkpoints were trained without those two tokens: given them, tiny.en answers
``<|endoftext|>`` at once (an empty transcript) where
``<|startoftranscript|><|notimestamps|>`` gives the words. The English-only
checkpoints are told apart by their vocabulary: 51864 tokens (tiny.en to medium.en,
distil-whisper's .en), where the multilingual ones have 51865 or 51866. Any other
size (a test's or a custom tokenizer's) keeps vLLM's prompt.
For such a checkpoint the prompt drops the language and task tokens, the language
is English whatever was asked or detected, and a translation is refused (HTTP 400).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config.speech_to_text import SpeechToTextParams

# The English-only checkpoints' vocabulary (OpenAI's GPT-2 based tokens, no language
# tokens beyond those the .en models were never prompted with).
ENGLISH_ONLY_VOCAB = 51864
_patched = False


def english_only(hf_config) -> bool:
    return (getattr(hf_config, "model_type", None) == "whisper"
            and getattr(hf_config, "vocab_size", None) == ENGLISH_ONLY_VOCAB)


def use_english_only_prompts() -> None:
    """For a process serving an English-only checkpoint: route vLLM's Whisper prompts
    through ``_prompt`` (a multilingual checkpoint's config keeps vLLM's own), and
    skip vLLM's language detection, which restricts the first token to language
    tokens an English-only tokenizer lacks (they map to ``<|endoftext|>``, and
    vLLM's parser then fails the request with a 500)."""
    global _patched
    if _patched:
        return
    _patched = True
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    WhisperForConditionalGeneration.supports_explicit_language_detection = False

    vllms = WhisperForConditionalGeneration.get_generation_prompt.__func__

    def get_generation_prompt(cls, stt_params: SpeechToTextParams):
        if not english_only(stt_params.model_config.hf_config):
            return vllms(cls, stt_params)
        return _prompt(stt_params)

    WhisperForConditionalGeneration.get_generation_prompt = classmethod(get_generation_prompt)


def _prompt(stt_params: SpeechToTextParams):
    from vllm.exceptions import VLLMValidationError
    from vllm.inputs import ExplicitEncoderDecoderPrompt, TextPrompt

    if stt_params.task_type != "transcribe":
        # A client error (HTTP 400), not a ValueError, which the route answers with 500.
        raise VLLMValidationError(
            "this Whisper checkpoint is English-only (a *.en model): it transcribes "
            "English and does not translate; use a multilingual checkpoint for "
            "/v1/audio/translations", parameter="model",
            value=stt_params.model_config.model)
    previous = f"<|startofprev|>{stt_params.request_prompt}" if stt_params.request_prompt else ""
    audio = (stt_params.audio, stt_params.stt_config.sample_rate)
    return ExplicitEncoderDecoderPrompt(
        encoder_prompt=TextPrompt(prompt="", multi_modal_data={"audio": audio}),
        decoder_prompt=TextPrompt(prompt=previous + "<|startoftranscript|><|notimestamps|>"))
