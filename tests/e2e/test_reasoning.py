"""Reasoning through `vllm serve --reasoning-parser qwen3`: reasoning separated from
content, the chat template's thinking switch, and a structured answer after the
reasoning (the grammar applies from </think> on).

References: the prompt equals transformers' rendering of the checkpoint's template
with the same switch; reasoning and content equal the answer's token ids, decoded
here and split at </think>; a streamed answer equals the non-streamed one.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from tests.e2e.agent_checkpoint import THINK_END
from tests.e2e.agent_requests import agent_chat, bias, raw_text, template_ids, token_id

ASK = [{"role": "user", "content": "Is Paris in France?"}]
VERDICT = {"type": "object", "properties": {
    "answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "score"], "additionalProperties": False}
AS_VERDICT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}


def _chat(server, **fields):
    fields.setdefault("tools", None)
    return agent_chat(server, messages=ASK, **fields)


@pytest.mark.parametrize("switch", [{"chat_template_kwargs": {"enable_thinking": False}},
                                    {"reasoning_effort": "none"}], ids=["kwargs", "effort"])
def test_thinking_off_renders_the_empty_think_and_answers_in_content(agent_server, agent_dir,
                                                                     switch):
    off, data = _chat(agent_server, max_tokens=12, logit_bias=bias(agent_dir), **switch)
    assert data["prompt_token_ids"] == template_ids(agent_dir, ASK, enable_thinking=False)
    assert off["reasoning"] == ""
    assert off["content"] == raw_text(agent_dir, data["choices"][0]["token_ids"])


def test_thinking_on_is_all_reasoning_until_the_end_tag(agent_server, agent_dir):
    on, data = _chat(agent_server, max_tokens=12, logit_bias=bias(agent_dir))
    assert data["prompt_token_ids"] == template_ids(agent_dir, ASK)
    assert data["prompt_token_ids"] != template_ids(agent_dir, ASK, enable_thinking=False)
    assert on["content"] == ""
    assert on["reasoning"] == raw_text(agent_dir, data["choices"][0]["token_ids"])


def _reasons_then_answers(agent_dir, data) -> int | None:
    """Where </think> is in the answer, if the model wrote some reasoning before it."""
    ids = data["choices"][0]["token_ids"]
    end = token_id(agent_dir, THINK_END)
    return ids.index(end) if end in ids[1:] else None


def test_structured_answer_after_the_reasoning(agent_server, agent_dir):
    """Unconstrained reasoning, then </think>, then JSON valid against the schema.

    A bias on </think> makes the model end its reasoning; the smallest bias of a
    sweep that leaves some reasoning before it is used (the weights decide which)."""
    end = str(token_id(agent_dir, THINK_END))
    for push in range(60, 101, 2):
        fields = dict(max_tokens=100, response_format=AS_VERDICT,
                      logit_bias={**bias(agent_dir), end: push})
        msg, data = _chat(agent_server, **fields)
        at = _reasons_then_answers(agent_dir, data)
        if at is not None:
            break
    else:
        pytest.fail("no bias on </think> let the model reason first")
    ids = data["choices"][0]["token_ids"]
    assert msg["reasoning"] == raw_text(agent_dir, ids[:at])
    assert msg["content"] == raw_text(agent_dir, ids[at + 1:])
    jsonschema.validate(json.loads(msg["content"]), VERDICT)
    streamed, _ = _chat(agent_server, stream=True, **fields)
    assert streamed == msg


def test_structured_answer_without_thinking_is_constrained_from_the_start(agent_server,
                                                                          agent_dir):
    fields = dict(max_tokens=100, response_format=AS_VERDICT, logit_bias=bias(agent_dir),
                  chat_template_kwargs={"enable_thinking": False})
    msg, _ = _chat(agent_server, **fields)
    assert msg["reasoning"] == ""
    jsonschema.validate(json.loads(msg["content"]), VERDICT)
    streamed, _ = _chat(agent_server, stream=True, **fields)
    assert streamed == msg


def test_thinking_token_budget_is_400_naming_it(agent_server):
    body = {"model": "agent", "messages": ASK, "max_tokens": 8, "thinking_token_budget": 4}
    resp = requests.post(agent_server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert "thinking_token_budget" in resp.json()["error"]["message"]
