"""vLLM's Anthropic Messages API (/v1/messages) through this plugin, spoken to by the
anthropic SDK: text answers with a system prompt, streaming, stop sequences, tool use
blocks, thinking blocks, token counting, and errors in Anthropic's shape.

References: the prompt's token count equals the chat template rendered here; a text
answer equals the OpenAI chat endpoint's greedy answer to the same conversation; a
streamed answer equals the non-streamed one; tool inputs are valid against their
input_schema. The anthropic SDK (2.x) has no temperature argument: greedy requests
pass it in extra_body, which vLLM reads.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
import requests

from tests.e2e import mlx_reference
from tests.e2e.agent_requests import SCHEMAS, TOOLS, bias, template_ids

GREEDY = {"temperature": 0}
SYSTEM = "You are a geography teacher. Answer in one sentence."
QUESTION = "What is the capital of France?"
# The agent checkpoint's tools in Anthropic's form; strict holds inputs to the schema.
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"], "strict": True} for t in TOOLS]


def _client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def _bundled_prompt_ids(messages) -> list[int]:
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    _, tokenizer = mlx_reference.load(DEFAULT_MODEL.path())
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def _text(message) -> str:
    assert [b.type for b in message.content] == ["text"], message.content
    return message.content[0].text


def _openai_answer(server, model, messages, **fields):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model=model, messages=messages, temperature=0,
                                          **fields).choices[0]


def _streamed(server, **kwargs) -> tuple[list, dict]:
    """(event types in order, {"text", "thinking", "tool_json", "stop_reason",
    "stop_sequence"}) of a streamed answer."""
    types, out = [], {"text": "", "thinking": "", "tool_json": "", "stop_reason": None,
                      "stop_sequence": None}
    for event in _client(server).messages.create(stream=True, **kwargs):
        types.append(event.type)
        if event.type == "content_block_delta":
            delta = event.delta
            out["text"] += getattr(delta, "text", "") or ""
            out["thinking"] += getattr(delta, "thinking", "") or ""
            out["tool_json"] += getattr(delta, "partial_json", "") or ""
        elif event.type == "message_delta":
            out["stop_reason"] = event.delta.stop_reason
            out["stop_sequence"] = event.delta.stop_sequence
    return types, out


def _assert_well_formed(types: list[str]) -> None:
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert types.count("content_block_start") == types.count("content_block_stop") >= 1
    assert types[-2] == "message_delta"


def test_text_answer_with_a_system_prompt(bundled_server):
    msg = _client(bundled_server).messages.create(
        model="smollm2", max_tokens=32, system=SYSTEM, extra_body=GREEDY,
        messages=[{"role": "user", "content": QUESTION}])
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    assert msg.usage.input_tokens == len(_bundled_prompt_ids(chat))
    reference = _openai_answer(bundled_server, "smollm2", chat, max_tokens=32)
    assert _text(msg) == reference.message.content
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        reference.finish_reason]
    assert msg.role == "assistant" and msg.type == "message"
    assert msg.usage.output_tokens > 0


def test_streamed_answer_equals_the_whole_one(bundled_server):
    kwargs = dict(model="smollm2", max_tokens=32, system=SYSTEM, extra_body=GREEDY,
                  messages=[{"role": "user", "content": QUESTION}])
    whole = _client(bundled_server).messages.create(**kwargs)
    types, streamed = _streamed(bundled_server, **kwargs)
    _assert_well_formed(types)
    assert streamed["text"] == _text(whole)
    assert streamed["stop_reason"] == whole.stop_reason


def test_stop_sequence_cuts_the_answer_there(bundled_server):
    kwargs = dict(model="smollm2", max_tokens=40, extra_body=GREEDY,
                  messages=[{"role": "user", "content": "Describe Paris in a few sentences."}])
    full = _text(_client(bundled_server).messages.create(**kwargs))
    words = full.split()
    assert len(words) > 6, full
    stop = " " + words[len(words) // 2]  # a word from the middle, as it appears
    assert stop in full, (stop, full)
    cut = _client(bundled_server).messages.create(stop_sequences=[stop, "never-seen"], **kwargs)
    assert _text(cut) == full[:full.index(stop)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    types, streamed = _streamed(bundled_server, stop_sequences=[stop], **kwargs)
    assert (streamed["text"], streamed["stop_reason"], streamed["stop_sequence"]) == (
        _text(cut), "stop_sequence", stop)


def test_count_tokens_is_the_rendered_prompt(bundled_server):
    count = _client(bundled_server).messages.count_tokens(
        model="smollm2", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    assert count.input_tokens == len(_bundled_prompt_ids(chat))


def _agent_extra(**more) -> dict:
    """Greedy and thinking off. (logit_bias is not an Anthropic field: vLLM drops it.)"""
    return {**GREEDY, "chat_template_kwargs": {"enable_thinking": False}, **more}


# One call each: random weights never end a run of parallel calls by themselves.
@pytest.mark.slow   # the agent server: with the slow tests (.ci/run)
@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_time"},
                                    {"type": "any", "disable_parallel_tool_use": True}],
                         ids=["named", "any"])
def test_tool_use_block_with_a_schema_valid_input(agent_server, agent_dir, choice):
    kwargs = dict(model="agent", max_tokens=600, tools=ANTHROPIC_TOOLS, tool_choice=choice,
                  messages=[{"role": "user", "content": "What time is it in Paris?"}],
                  extra_body=_agent_extra())
    msg = _client(agent_server).messages.create(**kwargs)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and msg.stop_reason == "tool_use", msg.content
    for use in uses:
        jsonschema.validate(use.input, SCHEMAS[use.name])
        assert use.id
    if choice["type"] == "tool":
        assert {u.name for u in uses} == {choice["name"]}
    assert len(uses) == 1
    types, streamed = _streamed(agent_server, **kwargs)
    _assert_well_formed(types)
    assert json.loads(streamed["tool_json"]) == uses[0].input  # the input_json_delta pieces
    assert streamed["stop_reason"] == "tool_use"


@pytest.mark.slow   # the agent server: with the slow tests (.ci/run)
def test_tool_result_turn(agent_server, agent_dir):
    """A tool_use block and its tool_result go back in; the template gets the call and
    the result, and the model calls again."""
    first = _client(agent_server).messages.create(
        model="agent", max_tokens=600, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        extra_body=_agent_extra())
    (use,) = [b for b in first.content if b.type == "tool_use"]
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [use.model_dump(include={
                    "type", "id", "name", "input"})]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "Sunny, 21 C"}]}]
    second = _client(agent_server).messages.create(
        model="agent", max_tokens=600, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=messages, extra_body=_agent_extra())
    assert [b.type for b in second.content].count("tool_use") >= 1
    openai_history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": use.id, "type": "function",
             "function": {"name": use.name, "arguments": use.input}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"}]
    assert second.usage.input_tokens == len(template_ids(
        agent_dir, openai_history, tools=TOOLS, enable_thinking=False))


@pytest.mark.slow   # the agent server: with the slow tests (.ci/run)
def test_thinking_block_and_thinking_disabled(agent_server, agent_dir):
    """The qwen3 reasoning parser's reasoning becomes a thinking block;
    thinking={"type": "disabled"} turns the template's thinking off."""
    ask = [{"role": "user", "content": QUESTION}]
    extra = {**GREEDY, "logit_bias": bias(agent_dir)}
    thinking = _client(agent_server).messages.create(model="agent", max_tokens=12,
                                                     messages=ask, extra_body=extra)
    assert [b.type for b in thinking.content] == ["thinking"]
    reference = _openai_answer(agent_server, "agent", ask, max_tokens=12,
                               logit_bias=bias(agent_dir))
    assert thinking.content[0].thinking == reference.message.reasoning
    off = _client(agent_server).messages.create(model="agent", max_tokens=12, messages=ask,
                                                thinking={"type": "disabled"}, extra_body=extra)
    assert off.usage.input_tokens == len(template_ids(agent_dir, ask, enable_thinking=False))
    assert [b.type for b in off.content] == ["text"]
    types, streamed = _streamed(agent_server, model="agent", max_tokens=12, messages=ask,
                                extra_body=extra)
    _assert_well_formed(types)
    assert streamed["thinking"] == thinking.content[0].thinking


def _error_body(exc: anthropic.APIStatusError) -> dict:
    body = exc.body
    assert body["type"] == "error", body
    return body["error"]


def test_errors_come_in_anthropic_shape(bundled_server):
    client = _client(bundled_server)
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ask)
    assert _error_body(missing.value)["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model="smollm2", max_tokens=8,
                               messages=[{"role": "user", "content": "word " * 3000}])
    error = _error_body(too_long.value)
    assert error["type"] == "invalid_request_error" and "context length" in error["message"]
    with pytest.raises(anthropic.BadRequestError) as too_many:
        client.messages.create(model="smollm2", max_tokens=4096, messages=ask)
    assert _error_body(too_many.value)["type"] == "invalid_request_error"
    assert requests.get(bundled_server.base_url + "/health", timeout=5).status_code == 200


@pytest.mark.slow   # the agent server: with the slow tests (.ci/run)
def test_refused_sampling_parameter_is_an_anthropic_400(agent_server):
    """thinking.type=enabled asks for a thinking-token budget, which vllm-metal refuses."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        _client(agent_server).messages.create(
            model="agent", max_tokens=2048, messages=[{"role": "user", "content": "hi"}],
            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=GREEDY)
    error = _error_body(refused.value)
    assert error["type"] == "invalid_request_error"
    assert "thinking_token_budget" in error["message"]


@pytest.mark.xfail(strict=True, reason=(
    "vLLM 0.33 answers request-validation errors on /v1/messages (a missing field, "
    "budget_tokens >= max_tokens) with its OpenAI error body, not Anthropic's"))
def test_validation_errors_come_in_anthropic_shape(bundled_server):
    resp = requests.post(bundled_server.base_url + "/v1/messages", timeout=60,
                         json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400
    assert resp.json().get("type") == "error"
