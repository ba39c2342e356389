"""`/v1/embeddings` through `vllm serve` and the `openai` SDK (base64 by default, as
the SDK asks), against transformers' forward of the same checkpoint: texts and token
ids, matryoshka `dimensions`, and the 4xx answers for what the model cannot do."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.e2e.conftest import PROMPTS
from tests.pooling_models import ReferenceEmbedder, cached_embedding_model, cosine

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def embed_dir():
    return cached_embedding_model("qwen3", pooling="last", normalize=True, matryoshka=[32, 64])


@pytest.fixture(scope="module")
def server(embed_dir):
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(embed_dir), "--max-model-len", "512", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "emb")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")


def _tokens(server, text: str) -> list[int]:
    r = requests.post(server.base_url + "/tokenize", json={"model": "emb", "prompt": text},
                      timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def test_embeddings_of_texts_match_transformers(server, client, embed_dir):
    ref = ReferenceEmbedder(embed_dir)
    got = client.embeddings.create(model="emb", input=PROMPTS)
    assert [d.index for d in got.data] == list(range(len(PROMPTS)))
    assert got.usage.prompt_tokens == sum(len(_tokens(server, p)) for p in PROMPTS)
    for prompt, item in zip(PROMPTS, got.data):
        want = ref.embed(_tokens(server, prompt), "last", normalize=True)
        assert len(item.embedding) == len(want)
        assert cosine(item.embedding, want) > 0.9999


def test_token_ids_in_give_the_texts_embeddings(server, client):
    ids = [_tokens(server, p) for p in PROMPTS[:3]]
    by_ids = client.embeddings.create(model="emb", input=ids, encoding_format="float")
    by_text = client.embeddings.create(model="emb", input=PROMPTS[:3])
    for a, b in zip(by_ids.data, by_text.data):
        np.testing.assert_array_equal(np.float32(a.embedding), np.float32(b.embedding))


def test_matryoshka_dimensions_truncate_then_normalise(server, client, embed_dir):
    ref = ReferenceEmbedder(embed_dir)
    got = client.embeddings.create(model="emb", input=PROMPTS[:2], dimensions=32)
    for prompt, item in zip(PROMPTS[:2], got.data):
        want = ref.embed(_tokens(server, prompt), "last", normalize=True, dimensions=32)
        assert len(item.embedding) == 32
        assert cosine(item.embedding, want) > 0.9999
        assert abs(np.linalg.norm(item.embedding) - 1.0) < 1e-5


def test_what_the_model_cannot_do_is_a_4xx_and_the_server_stays_up(server, client):
    import openai

    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="emb", input="hi", dimensions=7)
    for path, body in (("/v1/completions", {"model": "emb", "prompt": "hi", "max_tokens": 4}),
                       ("/v1/chat/completions",
                        {"model": "emb", "messages": [{"role": "user", "content": "hi"}]})):
        r = requests.post(server.base_url + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    assert len(client.embeddings.create(model="emb", input="still here").data) == 1
