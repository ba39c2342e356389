"""Micro-benchmark: the sampler per decode step, CPU kernels against MLX ops.

Prints a markdown table (docs/benchmarks.md, "Sampling"): milliseconds for one
step's sampling of R rows of a 49152-token vocab (SmolLM2's), from logits to
tokens (and logprobs), built and evaluated as the runner does it (host-side
batch arrays, keys, the graph, mx.eval). The logits are N(0, 1): a flat distribution, the
worst case for top-p (its 1024 candidates never hold 0.9 of the mass, so the
MLX path sorts the whole vocab). Median of the rounds.

    python benchmarks/bench_sampler.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from vllm import SamplingParams

from vllm_metal.v1.sampler import Sampler
from vllm_metal.v1.sampling_batch import RequestSamplingState, build_sampling_batch

VOCAB = 49152
CASES = [
    ("greedy", dict(temperature=0.0)),
    ("temperature 1", dict(temperature=1.0)),
    ("top_k 50", dict(temperature=0.8, top_k=50)),
    ("top_p 0.9", dict(temperature=0.8, top_p=0.9)),
    ("min_p 0.05 + top_k 40 + top_p 0.95", dict(temperature=0.7, min_p=0.05, top_k=40,
                                               top_p=0.95)),
    ("temperature 1, logprobs 5", dict(temperature=1.0, logprobs=5)),
    ("greedy, logprobs 1", dict(temperature=0.0, logprobs=1)),
]


def step_ms(sampler: Sampler, logits: mx.array, params: dict, rows: int, rounds: int) -> float:
    states = [RequestSamplingState(SamplingParams(**params), [1], []) for _ in range(rows)]
    times = []
    for i in range(rounds + 2):
        start = time.perf_counter()
        result = sampler(logits, build_sampling_batch(states, VOCAB))
        mx.eval(result.sampled, *(result.logprobs or ()))
        if i >= 2:   # warm-up rounds
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    mx.set_default_device(mx.cpu)
    print("| sampling | rows | CPU kernel (ms) | MLX ops (ms) | speed-up |")
    print("|---|---|---|---|---|")
    for rows in (1, 16):
        logits = mx.random.normal((rows, VOCAB), key=mx.random.key(rows))
        mx.eval(logits)
        for name, params in CASES:
            kernel = step_ms(Sampler(VOCAB, cpu_kernel=True), logits, params, rows, args.rounds)
            ops = step_ms(Sampler(VOCAB, cpu_kernel=False), logits, params, rows, args.rounds)
            # Below 4 greedy rows the sampler takes MLX's argmax on both paths.
            same = params == {"temperature": 0.0} and rows < 4
            ratio = "same path" if same else f"{ops / kernel:.1f}x"
            print(f"| {name} | {rows} | {kernel:.2f} | {ops:.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
