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
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import lark
import openai
import pytest
import requests

from tests.e2e.chat_stream import message, streamed_message

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)"
COLORS = ["red", "green", "blue", "light blue"]
# Sums with parentheses: not a regular language, so no regex could stand in for the
# grammar. The same language in both grammar syntaxes vLLM takes.
SUM_LARK = 'start: expr\nexpr: term ("+" term)*\nterm: NUM | "(" expr ")"\nNUM: /[1-9][0-9]?/\n'
SUM_EBNF = 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= num | "(" expr ")"\nnum ::= [1-9] [0-9]?\n'
SUM_PARSER = lark.Lark(SUM_LARK)
# Random weights love whitespace between JSON tokens: the schema answers take 130-220.
MAX_TOKENS = 300


def _is_person(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


def _is_email(text: str) -> None:
    assert re.fullmatch(EMAIL, text), text


def _is_color(text: str) -> None:
    assert text in COLORS, text


def _is_sum(text: str) -> None:
    SUM_PARSER.parse(text)  # raises on a string outside the language


# kind -> (request fields, reference check). json_schema goes through OpenAI's
# response_format, the rest through vLLM's structured_outputs.
CONSTRAINTS = {
    "json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}}, _is_person),
    "regex": ({"structured_outputs": {"regex": EMAIL}}, _is_email),
    "choice": ({"structured_outputs": {"choice": COLORS}}, _is_color),
    "grammar_lark": ({"structured_outputs": {"grammar": SUM_LARK}}, _is_sum),
    "grammar_ebnf": ({"structured_outputs": {"grammar": SUM_EBNF}}, _is_sum),
}


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
    for bad in ("", "0", "1+", "(1", "1 + 2", "123"):
        with pytest.raises(lark.exceptions.LarkError):
            _is_sum(bad)


def _completion_ids(server, model, prompt, max_tokens, **fields) -> tuple[list[int], str]:
    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "return_token_ids": True, **fields}
    resp = requests.post(server.base_url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["text"]


# Plain requests and constrained ones, each run alone and then all at once.
MIXED_PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,",
                 "Numbers: one two three", "She opened the door and saw"]


def assert_mixed_batch_is_reproducible(server, model, max_tokens):
    """Each request's greedy tokens are the same alone and in a batch of plain and
    constrained requests; the constrained ones pass their reference checks."""
    requests_ = [(p, {}) for p in MIXED_PROMPTS]
    for i, kind in enumerate(("json_schema", "regex", "choice", "grammar_ebnf")):
        fields, _ = CONSTRAINTS[kind]
        if kind == "json_schema":
            fields = {"structured_outputs": {"json": PERSON}}
        requests_.append((MIXED_PROMPTS[i], fields))
    alone = [_completion_ids(server, model, p, max_tokens, **f) for p, f in requests_]
    with ThreadPoolExecutor(len(requests_)) as pool:
        together = list(pool.map(lambda r: _completion_ids(server, model, r[0], max_tokens, **r[1]),
                                 requests_))
    assert together == alone
    for (_, text), kind in zip(alone[len(MIXED_PROMPTS):],
                               ("json_schema", "regex", "choice", "grammar_ebnf")):
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
