"""Images through `vllm serve` with the `openai` SDK: `image_url` parts as base64 data
URLs and as file URLs (under --allowed-local-media-path), streamed and not, for a
Qwen2.5-VL and a Gemma 3 checkpoint, against
transformers' greedy continuation of the same prompt; a text-only model's 400 for
an image; the server healthy after."""

from __future__ import annotations

import base64
import io

import pytest
import requests

from tests.vlm_models import ReferenceVLM, cached_vlm_model, make_image

pytest.importorskip("openai")
# Two servers (about half a minute): with the slow tests, which CI runs; the parity
# tests of the same path (test_vision) are in the README's test command.
pytestmark = pytest.mark.slow

MAX_TOKENS = 8


# M-RoPE positions; Gemma 3's image tokens attending to the whole image; Qwen3-VL's deepstack.
@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3", "qwen3_vl"])
def model_dir(request):
    return cached_vlm_model(request.param)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    from tests.e2e.server import VllmServer

    media = tmp_path_factory.mktemp("media")
    srv = VllmServer(str(model_dir), "--max-model-len", "512", "--max-num-seqs", "4",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "vlm",
                     "--allowed-local-media-path", str(media))
    srv.media = media
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _ask(client, url: str, stream: bool = False):
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in the picture?"}]}]
    return client.chat.completions.create(
        model="vlm", messages=messages, max_tokens=MAX_TOKENS, temperature=0.0,
        stream=stream, extra_body={"return_token_ids": True})


def _reference_text(model_dir, prompt_ids, image) -> tuple[list[int], str]:
    from transformers import AutoTokenizer

    tokens, _ = ReferenceVLM(model_dir).greedy(prompt_ids, [image], MAX_TOKENS)
    return tokens, AutoTokenizer.from_pretrained(model_dir).decode(tokens)


def test_a_base64_image_matches_transformers(client, model_dir):
    image = make_image(31, (84, 112))
    url = "data:image/png;base64," + base64.b64encode(_png(image)).decode()
    reply = _ask(client, url)
    choice = reply.choices[0]
    tokens, text = _reference_text(model_dir, reply.prompt_token_ids, image)
    assert choice.token_ids == tokens
    assert choice.message.content == text
    streamed = "".join(chunk.choices[0].delta.content or ""
                       for chunk in _ask(client, url, stream=True) if chunk.choices)
    assert streamed == text


def test_a_file_url_is_the_same_picture(client, server):
    image = make_image(32, (112, 56))
    path = server.media / "picture.png"
    path.write_bytes(_png(image))
    by_file = _ask(client, path.as_uri()).choices[0].token_ids
    inline = "data:image/png;base64," + base64.b64encode(_png(image)).decode()
    assert _ask(client, inline).choices[0].token_ids == by_file


def test_a_file_outside_the_allowed_path_is_refused(client, server, tmp_path):
    import openai

    path = tmp_path / "elsewhere.png"
    path.write_bytes(_png(make_image(33)))
    with pytest.raises(openai.BadRequestError):
        _ask(client, path.as_uri())
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200


def test_a_text_only_model_refuses_an_image():
    import openai

    from tests.e2e.server import VllmServer
    from tests.tiny_models import cached_tiny_model

    srv = VllmServer(str(cached_tiny_model("llama")), "--max-model-len", "256",
                     "--gpu-memory-utilization", "0.2", "--served-model-name", "text")
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
        url = "data:image/png;base64," + base64.b64encode(_png(make_image(34))).decode()
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="text", max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "Hi"}]}])
        assert "not a multimodal model" in str(err.value)
        assert requests.get(srv.base_url + "/health", timeout=10).status_code == 200
    finally:
        srv.stop()
