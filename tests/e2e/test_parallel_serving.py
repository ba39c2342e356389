"""`vllm serve --pipeline-parallel-size 2`, `--tensor-parallel-size 2` and
`--data-parallel-size 2` on one host: two ranks (over MLX's ring) or two engines give
one rank's greedy tokens under concurrency, streamed or not; a killed rank or engine
takes the server down within seconds and leaves nothing running.

Pipeline stages, tensor ranks (gathering each output projection's input, the
default on the CPU) and data-parallel engines compute what one rank computes: the
same tokens as one rank's default. Tensor ranks summing partial products
(VLLM_METAL_TP_GATHER=0) run each layer's modules in another summation order, so
they are compared with one rank's module path (VLLM_METAL_CPU_DECODER_STACK=0) in
fp32 activations (VLLM_METAL_CPU_INT8_ACTIVATIONS=0), where the order moves logits
by rounding only (int8 activations round such differences up to a quantization
step; docs/distributed.md)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import time

import pytest
import requests

from tests.e2e.server import VllmServer, running
from tests.family_models import cached_family_model
from tests.tiny_models import cached_tiny_model
from vllm_metal.engine_death import EXIT_STATUS

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "List three prime numbers:", "Water boils at", "The quick brown fox",
           "In the beginning", "Translate 'good morning' to Spanish:"]


def _model() -> str:
    # Three layers: the stages hold two and one (vLLM's split of an odd count). 6 query
    # heads over 3 KV heads: on two tensor ranks one holds a KV head and pads a phantom
    # (SmolLM2-135M's 9 over 3 does the same).
    return str(cached_tiny_model("llama", quantize_bits=4, group_size=32, num_hidden_layers=3,
                                 num_attention_heads=6, num_key_value_heads=3,
                                 hidden_size=192))


def _complete(server: VllmServer, prompt: str, stream: bool = False,
              model: str | None = None) -> list[int]:
    body = {"model": model or _model(), "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "logprobs": 1, "stream": stream, "ignore_eos": True}
    r = requests.post(server.base_url + "/v1/completions", json=body, timeout=300,
                      stream=stream)
    r.raise_for_status()
    if not stream:
        return r.json()["choices"][0]["logprobs"]["tokens"]
    tokens = []
    for line in r.iter_lines():
        line = line.decode()
        if line.startswith("data: ") and line != "data: [DONE]":
            import json

            tokens += json.loads(line[6:])["choices"][0]["logprobs"]["tokens"]
    return tokens


def _concurrent(server: VllmServer, stream: bool = False) -> list[list[int]]:
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: _complete(server, p, stream), PROMPTS))


MODULE_PATH = {"VLLM_METAL_CPU_DECODER_STACK": "0"}
SUMMED = {"VLLM_METAL_TP_GATHER": "0"}
# case -> (flag, environment of both runs, of the one-rank run, what the two log at
# load). Pipeline stages run the fused decoder stack as one rank does (and, with it
# off, the module path as one rank does): the same arithmetic. Data-parallel engines
# each run the whole model as one rank does.
MODES = {
    "pipeline": ("--pipeline-parallel-size", {}, {},
                 "(pipeline stage 1: layers 2-2): 1 layers, 6/3 heads, head_dim 64, "),
    "pipeline, module path": ("--pipeline-parallel-size", MODULE_PATH, {},
                              "pipeline stage 1: layers 2-2"),
    "tensor": ("--tensor-parallel-size", {}, {}, "tensor rank 1 of 2"),
    "tensor, summed": ("--tensor-parallel-size",
                       {**SUMMED, "VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"}, MODULE_PATH,
                       "tensor rank 1 of 2"),
    "data": ("--data-parallel-size", {}, {}, "Rank 1 of 2 on this host runs on cores"),
}


@pytest.mark.parametrize("case", MODES)
def test_two_ranks_give_one_ranks_greedy_tokens(case):
    flag, env, alone, logged = MODES[case]
    env = {**os.environ, **env}
    args = ("--max-model-len", "512")
    one = VllmServer(_model(), *args, env={**env, **alone})
    try:
        want = [_complete(one, p) for p in PROMPTS]
    finally:
        one.stop()
    two = VllmServer(_model(), *args, flag, "2", env=env)
    try:
        log = two.full_output()
        assert logged in log
        if case in ("pipeline", "tensor"):   # both ranks on the fused stack
            assert log.count("decoder stack as one CPU node") == 2, log[-4000:]
        assert [_complete(two, p) for p in PROMPTS] == want
        assert _concurrent(two) == want
        assert _concurrent(two, stream=True) == want
    finally:
        two.stop()


def test_summing_tensor_ranks_with_int8_activations_are_reproducible():
    # Alone, in a batch and streamed, the same tokens.
    server = VllmServer(_model(), "--max-model-len", "512", "--tensor-parallel-size", "2",
                        env={**os.environ, **SUMMED})
    try:
        assert "int8 activations" in server.output()
        want = [_complete(server, p) for p in PROMPTS]
        assert _concurrent(server) == want
        assert _concurrent(server, stream=True) == want
    finally:
        server.stop()


def test_tensor_ranks_serve_a_mixture_of_experts_model():
    # Experts' columns split and the block's output summed: one rank's tokens (fp32
    # activations: the sum moves logits by rounding only), alone, in a batch, streamed.
    model = str(cached_family_model("qwen3_moe", quantize_bits=4, group_size=32,
                                    num_hidden_layers=2))
    env = {**os.environ, "VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"}
    one = VllmServer(model, "--max-model-len", "512", env=env)
    try:
        want = [_complete(one, p, model=model) for p in PROMPTS]
    finally:
        one.stop()
    two = VllmServer(model, "--max-model-len", "512", "--tensor-parallel-size", "2", env=env)
    try:
        assert "Loaded qwen3_moe (tensor rank 1 of 2)" in two.full_output()
        assert [_complete(two, p, model=model) for p in PROMPTS] == want
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert list(pool.map(lambda p: _complete(two, p, True, model), PROMPTS)) == want
    finally:
        two.stop()


def _descendants(pid: int) -> list[tuple[int, str]]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True,
                         text=True, check=True).stdout
    rows = [line.strip().split(None, 2) for line in out.splitlines()]
    children: dict[int, list[tuple[int, str]]] = {}
    for row in rows:
        if len(row) == 3:
            children.setdefault(int(row[1]), []).append((int(row[0]), row[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


@pytest.mark.parametrize("flag,process", [("--pipeline-parallel-size", "Worker_PP0"),
                                          ("--pipeline-parallel-size", "Worker_PP1"),
                                          ("--tensor-parallel-size", "Worker_TP1"),
                                          ("--data-parallel-size", "EngineCore_DP1")])
def test_a_killed_rank_fails_the_server_within_seconds(flag, process):
    server = VllmServer(_model(), "--max-model-len", "512", flag, "2")
    try:
        before = _descendants(server.proc.pid)
        workers = [pid for pid, args in before if process in args]
        assert workers, before
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.proc.returncode == EXIT_STATUS, server.output()
        # A killed process may take a moment to finish dying after the server's exit
        # (the server waits for or kills each of them first: vllm_metal.engine_death).
        deadline = time.monotonic() + 5
        while any(running(pid) for pid, _ in before) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [(pid, args) for pid, args in before if running(pid)]
        assert not left, f"still running after the server exited: {left}\n{server.output()}"
    finally:
        server.stop()

