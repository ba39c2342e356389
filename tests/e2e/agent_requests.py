"""What the tool-calling, reasoning and Anthropic tests send to the agent server, and
their references: the tools, the token biases that steer random weights, a chat call
returning the answer with its token ids, the raw text of an answer decoded
independently of vLLM, and the prompt the checkpoint's template renders in transformers.

Random weights write whitespace wherever JSON allows it (their whitespace tokens score
near 0 where allowed words score below): WHITESPACE_BAN keeps arguments short. EOS and
the tool and thinking tags are damped in the checkpoint, so a bias is how a test makes
the model stop, call or end its reasoning at the first place the grammar allows.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import openai
import requests

from tests.e2e.agent_checkpoint import THINK_END, TOOL_CALL_START
from tests.e2e.chat_stream import streamed_message

# strict: the arguments are held to the parameters schema (vLLM's default holds only
# the call's envelope). Keys in the order vLLM hands tools to the template, so a
# template rendered here from these dicts equals the server's prompt.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city for some days",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days"], "additionalProperties": False},
    "strict": True}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False},
    "strict": True}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@functools.cache
def tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def token_id(model_dir: Path, text: str) -> int:
    return tokenizer(model_dir).token_to_id(text)


def raw_text(model_dir: Path, token_ids: list[int]) -> str:
    """The answer as the tokenizer decodes it (special tokens, i.e. EOS, dropped)."""
    return tokenizer(model_dir).decode(token_ids, skip_special_tokens=True)


@functools.cache
def whitespace_ban(model_dir: Path) -> dict[str, int]:
    tok = tokenizer(model_dir)
    return {str(i): -100 for i in range(tok.get_vocab_size())
            if not tok.decode([i]).strip()}


def bias(model_dir: Path, *, stop=False, call=False, end_thinking=False) -> dict[str, int]:
    """logit_bias: whitespace banned; EOS, <tool_call> or </think> pushed to the top."""
    out = dict(whitespace_ban(model_dir))
    for wanted, text in ((stop, "</s>"), (call, TOOL_CALL_START), (end_thinking, THINK_END)):
        if wanted:
            out[str(token_id(model_dir, text))] = 100
    return out


def hermes_calls(text: str) -> tuple[list[tuple[str, dict]], str]:
    """(calls, content before the first call) of Hermes-format text, parsed here."""
    calls = [json.loads(body) for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)]
    return [(c["name"], c["arguments"]) for c in calls], text.split("<tool_call>")[0]


def decoded_calls(message: dict) -> list[tuple[str, dict]]:
    """A chat_stream message's tool calls with their arguments parsed."""
    return [(name, json.loads(args)) for name, args in message["tool_calls"]]


def agent_chat(server, stream=False, messages=ASK, **fields) -> tuple[dict, dict]:
    """(chat_stream message, raw response JSON or {} when streamed)."""
    body = {"model": "agent", "messages": messages, "tools": TOOLS, "temperature": 0,
            "max_tokens": 300, **fields}
    if stream:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        std = ("model", "messages", "tools", "temperature", "max_tokens", "tool_choice",
               "logit_bias", "parallel_tool_calls")
        chunks = client.chat.completions.create(
            stream=True, extra_body={k: v for k, v in body.items() if k not in std},
            **{k: v for k, v in body.items() if k in std})
        return streamed_message(chunks), {}
    resp = requests.post(server.base_url + "/v1/chat/completions",
                         json={**body, "return_token_ids": True}, timeout=300)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    msg = {"content": choice["message"]["content"] or "",
           "reasoning": choice["message"].get("reasoning") or "",
           "tool_calls": [(c["function"]["name"], c["function"]["arguments"])
                          for c in choice["message"].get("tool_calls") or ()],
           "finish_reason": choice["finish_reason"]}
    return msg, data


def template_ids(model_dir, messages, **kwargs) -> list[int]:
    """The prompt transformers renders from the checkpoint's own chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                   **kwargs)
    return tok.encode(text, add_special_tokens=False)
