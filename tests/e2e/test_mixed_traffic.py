"""Mixed traffic on one server: plain, structured-output, tool-calling and Anthropic
requests at once, streamed and not, more of them than --max-num-seqs. Each greedy
answer must equal the same request's answer alone (the reproducibility rule): the
batch a request lands in, the grammar bitmasks of its neighbours and the sampling
path the batch takes change nothing.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import requests

from tests.e2e.agent_requests import TOOLS
from tests.e2e.constraints import EMAIL, PERSON

MODEL = "smollm2"
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 2 days?"}]


def _openai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _anthropic(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def plain_completion(server):
    body = {"model": MODEL, "prompt": "The history of the city of Rome", "temperature": 0,
            "max_tokens": 40, "return_token_ids": True}
    return requests.post(server.base_url + "/v1/completions", json=body,
                         timeout=300).json()["choices"][0]["token_ids"]


def plain_chat_streamed(server):
    chunks = _openai(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about cats."}],
        temperature=0, max_tokens=40, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def schema_chat(server):
    resp = _openai(server).chat.completions.create(
        model=MODEL, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Describe a person with their pets, as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    return json.loads(resp.choices[0].message.content)


def regex_completion_streamed(server):
    chunks = _openai(server).completions.create(
        model=MODEL, prompt="My email address is", temperature=0, max_tokens=30, stream=True,
        extra_body={"structured_outputs": {"regex": EMAIL}})
    return "".join(c.choices[0].text for c in chunks if c.choices)


def tool_call(server):
    resp = _openai(server).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=100)
    return [(c.function.name, json.loads(c.function.arguments))
            for c in resp.choices[0].message.tool_calls]


def anthropic_text(server):
    msg = _anthropic(server).messages.create(
        model=MODEL, max_tokens=40, system="Answer briefly.", extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Why is the sea salty?"}])
    return [(b.type, b.text) for b in msg.content]


def anthropic_streamed(server):
    events = _anthropic(server).messages.create(
        model=MODEL, max_tokens=40, stream=True, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Name three rivers."}])
    return "".join(getattr(e.delta, "text", "") or "" for e in events
                   if e.type == "content_block_delta")


def anthropic_tool(server):
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"], "strict": True} for t in TOOLS]
    msg = _anthropic(server).messages.create(
        model=MODEL, max_tokens=100, tools=tools, messages=ASK, extra_body={"temperature": 0},
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    return [(b.name, b.input) for b in msg.content if b.type == "tool_use"]


KINDS = [plain_completion, plain_chat_streamed, schema_chat, regex_completion_streamed,
         tool_call, anthropic_text, anthropic_streamed, anthropic_tool]


def test_every_answer_is_the_same_alone_and_in_mixed_traffic(bundled_server):
    alone = [kind(bundled_server) for kind in KINDS]
    assert all(alone), alone  # each kind really answered something
    # Two of each at once: 16 requests over 8 sequences, queued and batched in turns.
    with ThreadPoolExecutor(2 * len(KINDS)) as pool:
        together = list(pool.map(lambda kind: kind(bundled_server), KINDS * 2))
    for kind, expected, first, second in zip(KINDS, alone, together, together[len(KINDS):]):
        assert first == expected and second == expected, kind.__name__
