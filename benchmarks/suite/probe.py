"""Warm a started server up and measure its single-stream pace, before any level runs.

The pace sizes the first level under the time cap. The warm-up and probe prompts are
plain English, sharing no prefix with the benchmark's random-token prompts, so no
level starts from a warm prefix cache (`vllm bench serve`'s own warm-up resends the
level's first prompt: that request then skipped its prefill on every server).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import requests

from benchmarks.suite.servers.base import Launch

# One token per word with SmolLM2's tokenizer: 256 words make a 256-token prompt.
PROBE_WORDS = ("the city began as a small market town on the river and grew over many "
               "years into a busy port where people came from far away to trade and live").split()
PROBE_TOKENS = 16


@dataclass(frozen=True)
class Pace:
    """One request alone on the server."""

    ttft_s: float   # time to first token of a ~input_len-token prompt
    tpot_s: float   # seconds per output token after the first

    def request_s(self, output_len: int) -> float:
        """Seconds one request of `output_len` tokens takes alone."""
        return self.ttft_s + max(0, output_len - 1) * self.tpot_s


def probe_prompt(words: int) -> str:
    if words < 1:
        raise ValueError(f"words must be >= 1, got {words}")
    return " ".join(PROBE_WORDS[i % len(PROBE_WORDS)] for i in range(words))


def token_times(base_url: str, launch: Launch, prompt: str, max_tokens: int,
                timeout: float) -> list[float]:
    """Seconds from sending one streaming greedy /v1/completions request to each chunk
    that carries text."""
    body = {"model": launch.model_name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, **(launch.extra_body or {})}
    times = []
    begin = time.monotonic()
    with requests.post(base_url + "/v1/completions", json=body, stream=True,
                       timeout=timeout) as r:
        r.raise_for_status()
        # One byte per read: a larger read blocks until that many bytes arrive on servers
        # that stream without chunked encoding, which would delay the timestamps.
        for line in r.iter_lines(chunk_size=1):
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                break
            choices = json.loads(data).get("choices") or []
            if choices and choices[0].get("text"):
                times.append(time.monotonic() - begin)
    return times


def warm_up_and_probe(base_url: str, launch: Launch, input_len: int,
                      timeout: float = 900.0) -> Pace | None:
    """A short warm-up request (first-request costs: lazy init, allocation), then the probe:
    an `input_len`-word prompt and PROBE_TOKENS output tokens. None when either fails."""
    try:
        token_times(base_url, launch, "The history of the city begins", 4, timeout)
        times = token_times(base_url, launch, probe_prompt(input_len), PROBE_TOKENS, timeout)
    except (requests.RequestException, ValueError):
        return None
    if len(times) < 2:
        return None
    return Pace(ttft_s=times[0], tpot_s=(times[-1] - times[0]) / (len(times) - 1))
