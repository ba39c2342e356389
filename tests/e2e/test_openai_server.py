"""``vllm serve`` through this plugin, spoken to by the openai client."""

import json

import openai
import pytest
import requests

from tests.e2e import mlx_reference
from tests.e2e.server import VllmServer

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = VllmServer(str(llama_dir), "--max-model-len", "256", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")


def _expected_text(llama_dir, prompt_ids):
    return mlx_reference.greedy_text(llama_dir, prompt_ids, MAX_TOKENS)


def _chat_prompt_ids(llama_dir, messages):
    _, tokenizer = mlx_reference.load(llama_dir)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_completion_matches_mlx_lm(client, llama_dir):
    prompt = "The quick brown fox"
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                     temperature=0)
    ids = mlx_reference.tokenize(llama_dir, prompt)
    # mlx-lm's detokenizer drops the first token's leading space; compare stripped.
    assert resp.choices[0].text.strip() == _expected_text(llama_dir, ids).strip()


def test_streaming_completion_equals_non_streaming(client):
    kwargs = dict(model="tiny", prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0)
    full = client.completions.create(**kwargs).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
    assert "".join(chunks) == full and len(chunks) > 1


def test_chat_completion_matches_mlx_lm(client, llama_dir):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    resp = client.chat.completions.create(model="tiny", messages=messages,
                                          max_tokens=MAX_TOKENS, temperature=0)
    expected = _expected_text(llama_dir, _chat_prompt_ids(llama_dir, messages))
    assert resp.choices[0].message.content.strip() == expected.strip()


def test_streaming_chat(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "Hello there"}],
                  max_tokens=MAX_TOKENS, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in
             client.chat.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(parts) == full


def _post(server, path, body, raw=False):
    data = body if raw else json.dumps(body)
    return requests.post(server.base_url + path, data=data,
                         headers={"Content-Type": "application/json"}, timeout=60)


@pytest.mark.parametrize("body,status", [
    ({"model": "tiny", "prompt": "hi", "max_tokens": -1}, 400),
    ({"model": "tiny", "prompt": "word " * 400, "max_tokens": 4}, 400),
    ({"model": "no-such-model", "prompt": "hi", "max_tokens": 4}, 404),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 4, "temperature": -1}, 400),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 4, "top_p": 0}, 400),
])
def test_bad_requests_are_4xx_and_server_stays_healthy(server, body, status):
    resp = _post(server, "/v1/completions", body)
    assert resp.status_code == status, resp.text
    assert "message" in resp.json().get("error", resp.json())
    assert requests.get(server.base_url + "/health", timeout=5).status_code == 200


def test_malformed_json_is_400(server):
    resp = _post(server, "/v1/completions", b'{"model": "tiny", "prompt": ', raw=True)
    assert 400 <= resp.status_code < 500
    ok = _post(server, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200
