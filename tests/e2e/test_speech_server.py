"""`/v1/audio/transcriptions` and `/v1/audio/translations` through `vllm serve` with the
`openai` SDK on a tiny random Whisper: a spoken clip (espeak-ng) as WAV at 22.05 kHz,
FLAC and MP3 gives transformers' own greedy text on the samples vLLM decodes; streamed
equals not; a language that is not Whisper's and a model without the task are refused
with a 4xx, and the server stays healthy."""

from __future__ import annotations

import io

import numpy as np
import pytest
import requests

from tests.speech_models import ReferenceWhisper, cached_whisper_model, speech_clip

pytestmark = pytest.mark.slow

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir():
    return cached_whisper_model()


@pytest.fixture(scope="module")
def server(model_dir):
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(model_dir), "--max-model-len", "64", "--max-num-seqs", "4",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "whisper")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")


def _encoded(kind: str) -> bytes:
    """The clip as ``kind`` (wav: the file; flac, mp3: re-encoded)."""
    data = speech_clip().read_bytes()
    if kind == "wav":
        return data
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    buf = io.BytesIO()
    if kind == "flac":
        soundfile.write(buf, samples, rate, format="FLAC")
        return buf.getvalue()
    import av

    with av.open(buf, "w", format="mp3") as out:
        stream = out.add_stream("mp3", rate=rate)
        frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def _reference(model_dir, data: bytes, prompt: str) -> str:
    """transformers' greedy text for the samples vLLM's own loader makes of ``data``."""
    from transformers import AutoTokenizer
    from vllm.multimodal.media.audio import load_audio

    samples, _ = load_audio(io.BytesIO(data), sr=16000, mono=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    tokens, _ = ReferenceWhisper(model_dir).greedy(ids, np.asarray(samples, np.float32),
                                                   MAX_TOKENS)
    return tokenizer.decode(tokens, skip_special_tokens=True)


def _reference_segments(model_dir, data: bytes, prompt: str) -> list[tuple]:
    """(start, end, text) of each timed segment transformers' decode finds in its
    greedy tokens after ``prompt`` (which ends with the first timestamp)."""
    from transformers import AutoTokenizer
    from vllm.multimodal.media.audio import load_audio

    samples, _ = load_audio(io.BytesIO(data), sr=16000, mono=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    tokens, _ = ReferenceWhisper(model_dir).greedy(ids, np.asarray(samples, np.float32),
                                                   MAX_TOKENS)
    if tokenizer.eos_token_id in tokens:
        tokens = tokens[:tokens.index(tokenizer.eos_token_id)]
    offsets = tokenizer.decode(ids[-1:] + tokens, output_offsets=True)["offsets"]
    return [(o["timestamp"][0], o["timestamp"][1], o["text"]) for o in offsets]


def _transcribe(client, data: bytes, name: str, **kwargs):
    return client.audio.transcriptions.create(
        model="whisper", file=(name, data), language=kwargs.pop("language", "en"),
        extra_body={"max_completion_tokens": MAX_TOKENS}, **kwargs)


@pytest.mark.parametrize("kind", ["wav", "flac", "mp3"])
def test_transcription_matches_transformers(client, model_dir, kind):
    data = _encoded(kind)
    text = _transcribe(client, data, f"clip.{kind}").text
    prompt = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    assert text.strip() and text == _reference(model_dir, data, prompt)


def test_streamed_transcription_equals_the_whole(client):
    data = _encoded("wav")
    whole = _transcribe(client, data, "clip.wav").text
    # vLLM streams chat-style chunks; the SDK hands them over as plain dicts.
    chunks = _transcribe(client, data, "clip.wav", stream=True)
    streamed = "".join(c.choices[0]["delta"].get("content") or ""
                       for c in chunks if c.choices)
    assert streamed == whole


def test_translation_matches_transformers(client, model_dir):
    data = _encoded("wav")
    text = client.audio.translations.create(
        model="whisper", file=("clip.wav", data),
        extra_body={"max_completion_tokens": MAX_TOKENS, "language": "fr"}).text
    prompt = "<|startoftranscript|><|fr|><|translate|><|notimestamps|>"
    assert text == _reference(model_dir, data, prompt)
    assert text != _transcribe(client, data, "clip.wav").text   # the task tokens count


def test_the_prompt_parameter_is_earlier_text_after_startofprev(client, model_dir):
    """The request's prompt reaches the decoder as transformers' prompt ids put it
    (tests/e2e/test_speech_real.py checks the ids), and steers the text."""
    import openai

    data = _encoded("wav")
    text = _transcribe(client, data, "clip.wav", prompt="hi there").text
    sot = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    assert text == _reference(model_dir, data, "<|startofprev|> hi there" + sot)
    with pytest.raises(openai.BadRequestError, match="special tokens"):
        _transcribe(client, data, "clip.wav", prompt="<|fr|> hi")


def test_verbose_json_reports_the_language_and_duration(client):
    reply = _transcribe(client, _encoded("wav"), "clip.wav", response_format="verbose_json")
    assert reply.language == "en"
    assert abs(reply.duration - 23482 / 22050) < 0.01   # the clip's samples at its rate


def test_a_language_whisper_lacks_is_refused(client, server):
    import openai

    with pytest.raises(openai.BadRequestError):
        _transcribe(client, _encoded("wav"), "clip.wav", language="xx")
    with pytest.raises(openai.BadRequestError):
        _transcribe(client, b"not audio at all", "clip.wav")
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200


def test_a_text_model_has_no_transcription_route(plain_server):
    files = {"file": ("clip.wav", _encoded("wav"), "audio/wav")}
    reply = requests.post(plain_server.base_url + "/v1/audio/transcriptions", files=files,
                          data={"model": "tiny"}, timeout=30)
    assert reply.status_code == 404   # the route is not offered


def test_a_real_english_only_whisper_through_the_api():
    """tiny.en (tests/real_whisper.py): the API's prompt is the English-only one, the
    text is what transformers' greedy decoding reads from the same samples, with or
    without a language, and a translation is refused."""
    import openai

    from tests.e2e.server import VllmServer
    from tests.real_whisper import cached_tiny_en

    model_dir = cached_tiny_en()
    srv = VllmServer(str(model_dir), "--max-model-len", "448", "--max-num-seqs", "4",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny.en")
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
        data = _encoded("wav")
        text = client.audio.transcriptions.create(
            model="tiny.en", file=("clip.wav", data), language="en",
            extra_body={"max_completion_tokens": MAX_TOKENS}).text
        assert "world" in text.lower()
        assert text == _reference(model_dir, data, "<|startoftranscript|><|notimestamps|>")
        prompted = client.audio.transcriptions.create(
            model="tiny.en", file=("clip.wav", data), prompt="Hello world.",
            extra_body={"max_completion_tokens": MAX_TOKENS}).text
        assert prompted == _reference(
            model_dir, data, "<|startofprev|> Hello world.<|startoftranscript|><|notimestamps|>")
        # No language: English without vLLM's detection (its language tokens are not
        # an English-only model's).
        assert client.audio.transcriptions.create(
            model="tiny.en", file=("clip.wav", data),
            extra_body={"max_completion_tokens": MAX_TOKENS}).text == text
        with pytest.raises(openai.BadRequestError, match="English-only"):
            client.audio.translations.create(model="tiny.en", file=("clip.wav", data))
        with pytest.raises(openai.BadRequestError, match="English-only"):
            client.audio.transcriptions.create(model="tiny.en", file=("clip.wav", data),
                                               language="fr")
        # Timestamps: vLLM's verbose_json asks for them (<|0.00|> for <|notimestamps|>)
        # and cuts segments at them, as transformers' decode offsets do.
        verbose = client.audio.transcriptions.create(
            model="tiny.en", file=("clip.wav", data), response_format="verbose_json",
            extra_body={"max_completion_tokens": MAX_TOKENS})
        assert verbose.language == "en"
        assert [(x.start, x.end, x.text) for x in verbose.segments] == _reference_segments(
            model_dir, data, "<|startoftranscript|><|0.00|>")
        assert verbose.segments and "world" in verbose.text.lower()
        assert requests.get(srv.base_url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()
