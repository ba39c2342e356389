"""Structured outputs through `vllm serve`: each constraint kind, chat and completions,
streamed and not, each answer checked by an independent reference (jsonschema,
re.fullmatch, membership, a Lark parser of the grammar's language); constrained and
plain requests in one batch; requests that cannot be honoured are 400s.

The tiny checkpoints write gibberish, but a constrained answer is valid whatever the
weights, which is what these tests hold the bitmask path to. Greedy answers must not
depend on streaming or on the batch (the reproducibility rule).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import lark
import openai
import pytest
import requests

from tests.e2e.chat_stream import message, streamed_message
from tests.e2e.constraints import CONSTRAINTS, EMAIL, PERSON, is_sum

# Random weights love whitespace between JSON tokens: the schema answers take 130-220.
MAX_TOKENS = 300


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chat(server, model, fields, prompt="Tell me about someone.", stream=False, **kw) -> dict:
    """The answer's message (chat_stream shape), streamed or not."""
    extra = {k: v for k, v in fields.items() if k != "response_format"}
    resp = _client(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=MAX_TOKENS, response_format=fields.get("response_format", openai.NOT_GIVEN),
        extra_body=extra or None, stream=stream, **kw)
    return streamed_message(resp) if stream else message(resp)


def complete(server, model, fields, prompt="Here it is:", stream=False) -> str:
    resp = _client(server).completions.create(
        model=model, prompt=prompt, temperature=0, max_tokens=MAX_TOKENS, extra_body=fields,
        stream=stream)
    if stream:
        return "".join(c.choices[0].text for c in resp if c.choices)
    return resp.choices[0].text


@pytest.mark.parametrize("kind", CONSTRAINTS)
def test_chat_answer_obeys_the_constraint_streamed_or_not(plain_server, kind):
    fields, check = CONSTRAINTS[kind]
    whole = chat(plain_server, "tiny", fields)
    check(whole["content"])
    assert whole["finish_reason"] == "stop"  # the grammar ended it, not max_tokens
    assert chat(plain_server, "tiny", fields, stream=True) == whole


@pytest.mark.parametrize("kind", CONSTRAINTS)
def test_completion_obeys_the_constraint_streamed_or_not(plain_server, kind):
    fields, check = CONSTRAINTS[kind]
    if "response_format" in fields:  # completions take the schema as structured_outputs
        fields = {"structured_outputs": {"json": PERSON}}
    text = complete(plain_server, "tiny", fields)
    check(text)
    assert complete(plain_server, "tiny", fields, stream=True) == text


def test_grammar_reference_rejects_what_the_grammar_excludes():
    """The reference parser is not a yes-machine."""
    for bad in ("", "0", "1+", "(1", "1 + 2", "123", "1+2+3+4"):
        with pytest.raises(lark.exceptions.LarkError):
            is_sum(bad)


def _completion_ids(server, model, prompt, max_tokens, **fields) -> tuple[list[int], str]:
    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "return_token_ids": True, **fields}
    resp = requests.post(server.base_url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["text"]


# Plain requests, and constrained ones whose prompts ask for what the constraint
# wants (a real model given an unrelated prompt may fill a schema's optional
# whitespace with newlines until max_tokens).
MIXED_PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,",
                 "Numbers: one two three", "She opened the door and saw"]
CONSTRAINED = [("Here is a person as JSON:", {"structured_outputs": {"json": PERSON}}, "json_schema"),
               ("My email address is", CONSTRAINTS["regex"][0], "regex"),
               ("My favourite color is", CONSTRAINTS["choice"][0], "choice"),
               ("Two plus three is written", CONSTRAINTS["grammar_ebnf"][0], "grammar_ebnf")]


def assert_mixed_batch_is_reproducible(server, model, max_tokens):
    """Each request's greedy tokens are the same alone and in a batch of plain and
    constrained requests; the constrained ones pass their reference checks."""
    batch = [(p, {}) for p in MIXED_PROMPTS] + [(p, f) for p, f, _ in CONSTRAINED]
    alone = [_completion_ids(server, model, p, max_tokens, **f) for p, f in batch]
    with ThreadPoolExecutor(len(batch)) as pool:
        together = list(pool.map(lambda r: _completion_ids(server, model, r[0], max_tokens, **r[1]),
                                 batch))
    assert together == alone
    for (_, text), (_, _, kind) in zip(alone[len(MIXED_PROMPTS):], CONSTRAINED):
        CONSTRAINTS[kind][1](text)


def test_plain_and_constrained_requests_in_one_batch(plain_server):
    assert_mixed_batch_is_reproducible(plain_server, "tiny", MAX_TOKENS)


@pytest.mark.parametrize("fields,says", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "regex"),
    ({"structured_outputs": {"json": {"type": "no-such-type"}}}, "no-such-type"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "one kind"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"structured_outputs": {"choice": []}}, "choice"),
    # Options vLLM 0.33 reads only server-wide, or nowhere: refused by vllm-metal
    # (vllm_metal/structured_output_options.py) instead of silently dropped.
    ({"structured_outputs": {"json": PERSON, "disable_any_whitespace": True}},
     "--structured-outputs-config"),
    ({"structured_outputs": {"regex": EMAIL, "whitespace_pattern": "[ ]?"}},
     "whitespace_pattern"),
])
def test_unusable_constraints_are_400_naming_the_problem(plain_server, fields, says):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, **fields}
    resp = requests.post(plain_server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert says.lower() in resp.json()["error"]["message"].lower()
    assert requests.get(plain_server.base_url + "/health", timeout=5).status_code == 200


# The bundled SmolLM2 writes real text: JSON it was asked for, and its plain requests
# take the head's fused argmax alone but the sampler's masked path beside a constrained
# one, which must give the same tokens.

@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_object"}},
    CONSTRAINTS["json_schema"][0],
], ids=["json_object", "json_schema"])
def test_bundled_model_writes_the_json_asked_for(bundled_server, fields):
    prompt = "Describe a person with a name, an age and their pets, as JSON."
    whole = chat(bundled_server, "smollm2", fields, prompt=prompt)
    value = json.loads(whole["content"])
    assert isinstance(value, dict)
    if "json_schema" in fields["response_format"]:
        jsonschema.validate(value, PERSON)
    assert chat(bundled_server, "smollm2", fields, prompt=prompt, stream=True) == whole


def test_bundled_model_picks_one_of_the_choices(bundled_server):
    fields, check = CONSTRAINTS["choice"]
    whole = chat(bundled_server, "smollm2", fields, prompt="What color is the sky on a clear day?")
    check(whole["content"])


def test_bundled_model_plain_and_constrained_in_one_batch(bundled_server):
    assert_mixed_batch_is_reproducible(bundled_server, "smollm2", 96)
