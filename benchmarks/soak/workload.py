"""The soak's mixed load: every kind of request a served model gets, from N clients.

Each client loops until the deadline, drawing a request kind at random (seeded per
client, so two runs send the same sequence): chat and completions, streamed and
not, greedy and sampled, logprobs, prompt logprobs, JSON-schema output, penalties,
n=2, streams the client drops after a few chunks, and invalid requests that must
be refused with a 4xx. Prompts are random words (new KV blocks every request) or a
shared long prefix with a random tail (prefix-cache hits). A canary greedy request
is re-sent every minute: its text must never change while the server runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

WORDS = ("river stone window garden lantern copper harbor meadow signal violet engine "
         "thunder pocket ladder silver orchard candle marble falcon quiet ember glacier "
         "compass velvet anchor prairie beacon willow cobalt summit").split()
SHARED_PREFIX = ("You are a careful assistant. Answer in plain sentences. " * 12).strip()
CANARY = "List the first ten prime numbers, separated by commas:"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
KINDS = ("chat", "chat_stream_sampled", "completion_logprobs", "completion_stream_long",
         "json_schema", "cancelled_stream", "invalid", "penalties", "prompt_logprobs",
         "n2_sampled", "shared_prefix")


@dataclass
class Tally:
    """What the clients saw. ``unexpected`` lists failures (a valid request not answered
    200, an invalid one not refused with 4xx, a canary whose text changed)."""

    sent: Counter = field(default_factory=Counter)
    ok: Counter = field(default_factory=Counter)
    output_tokens: int = 0
    canaries: int = 0
    unexpected: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.unexpected) < 50:
            self.unexpected.append(what)
        else:
            self.unexpected[-1] = f"... and more; last: {what}"


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def request_for(kind: str, rng: random.Random, model: str) -> tuple[str, dict, int]:
    """(path, body, expected status) for one request of ``kind``."""
    prompt = _words(rng, 8, 300)
    chat = [{"role": "user", "content": prompt}]
    if kind == "chat":
        return "/v1/chat/completions", {"model": model, "messages": chat, "max_tokens": 64,
                                        "temperature": 0}, 200
    if kind == "chat_stream_sampled":
        return "/v1/chat/completions", {"model": model, "messages": chat, "max_tokens": 96,
                                        "temperature": 0.9, "top_p": 0.9, "stream": True,
                                        "seed": rng.randint(0, 2**31)}, 200
    if kind == "completion_logprobs":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 32,
                                   "logprobs": 5, "temperature": 0, "ignore_eos": True}, 200
    if kind == "completion_stream_long":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 256,
                                   "temperature": 0, "ignore_eos": True, "stream": True}, 200
    if kind == "json_schema":
        return "/v1/chat/completions", {
            "model": model, "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": f"Describe a person. {prompt[:200]}"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": SCHEMA}}}, 200
    if kind == "cancelled_stream":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 512,
                                   "ignore_eos": True, "stream": True}, 200
    if kind == "invalid":
        bad = rng.choice([{"max_tokens": -5}, {"temperature": -1.0}, {"top_p": 7},
                          {"logprobs": 10_000}, {"n": 0}])
        return "/v1/completions", {"model": model, "prompt": prompt, **bad}, 400
    if kind == "penalties":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 48,
                                   "temperature": 0.7, "top_k": 20, "presence_penalty": 0.5,
                                   "frequency_penalty": 0.3, "repetition_penalty": 1.2,
                                   "seed": rng.randint(0, 2**31)}, 200
    if kind == "prompt_logprobs":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 8,
                                   "prompt_logprobs": 2, "temperature": 0}, 200
    if kind == "n2_sampled":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 40, "n": 2,
                                   "temperature": 1.0, "seed": rng.randint(0, 2**31)}, 200
    if kind == "shared_prefix":
        return "/v1/completions", {"model": model, "prompt": f"{SHARED_PREFIX} {_words(rng, 1, 20)}",
                                   "max_tokens": 48, "temperature": 0}, 200
    raise ValueError(kind)


async def _send(session: aiohttp.ClientSession, base: str, kind: str, path: str, body: dict,
                expected: int, tally: Tally) -> str | None:
    """Send one request and check it; returns the text of a non-streamed completion."""
    tally.sent[kind] += 1
    async with session.post(base + path, json=body) as resp:
        if resp.status != expected:
            tally.fail(f"{kind}: HTTP {resp.status} (expected {expected}): "
                       f"{(await resp.text())[:200]}")
            return None
        if expected != 200:
            tally.ok[kind] += 1
            return None
        if body.get("stream"):
            chunks = 0
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunks += 1
                if kind == "cancelled_stream" and chunks >= 3:
                    break  # leaving the block closes the connection mid-generation
            tally.output_tokens += chunks
            tally.ok[kind] += 1
            return None
        data = await resp.json()
        tally.output_tokens += data.get("usage", {}).get("completion_tokens", 0)
        choice = data["choices"][0]
        text = choice.get("text") if "text" in choice else choice["message"]["content"]
        # A tiny model can spend max_tokens inside one JSON value (a number that never
        # ends): only an output the grammar let finish must parse.
        if kind == "json_schema" and choice.get("finish_reason") == "stop":
            try:
                parsed = json.loads(text)
                assert set(parsed) == {"name", "age"} and isinstance(parsed["age"], int)
            except (ValueError, AssertionError, TypeError):
                tally.fail(f"json_schema: output does not follow the schema: {text[:200]!r}")
                return None
        tally.ok[kind] += 1
        return text


async def _client(index: int, base: str, model: str, deadline: float, tally: Tally,
                  canary: dict) -> None:
    rng = random.Random(1000 + index)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if index == 0 and time.monotonic() >= canary["next"]:
                canary["next"] = time.monotonic() + 60
                body = {"model": model, "prompt": CANARY, "max_tokens": 40, "temperature": 0}
                try:
                    text = await _send(session, base, "canary", "/v1/completions", body, 200, tally)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    tally.fail(f"canary: {type(e).__name__}: {e}")
                    continue
                tally.canaries += 1
                if canary.setdefault("text", text) != text:
                    tally.fail(f"canary changed: {canary['text']!r} -> {text!r}")
                continue
            kind = rng.choice(KINDS)
            path, body, expected = request_for(kind, rng, model)
            try:
                await _send(session, base, kind, path, body, expected, tally)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                tally.fail(f"{kind}: {type(e).__name__}: {e}")


async def run_load(base: str, model: str, clients: int, seconds: float) -> Tally:
    """Drive ``clients`` concurrent loops for ``seconds``; every request finishes."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    canary = {"next": 0.0}
    await asyncio.gather(*(_client(i, base, model, deadline, tally, canary)
                           for i in range(clients)))
    return tally
