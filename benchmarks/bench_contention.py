"""Single-stream serving beside a CPU-bound neighbour: output tok/s at c=1, quiet and
with one busy process pinned to one core (as a user's compiler or browser would be).

    python benchmarks/bench_contention.py [--model PATH] [--modes default exact]
        [--tokens 128] [--rounds 3] [--core 0]

One `vllm-metal serve` per mode, started first. Each round times one greedy request
(a docs paragraph as the prompt, ignore_eos, streamed) quiet, then again with the
busy process running, then stops it; the medians of the rounds and their ratio are
printed as a markdown row per mode (docs/benchmarks.md, "Under contention").
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_speculative import passages  # noqa: E402
from tests.e2e.server import VllmServer  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

MODES = {
    "default": {},   # int8 activations, an fp16 KV cache
    "exact": {"VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"},
}


def spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    while True:
        pass


def one_request(server: VllmServer, prompt: str, tokens: int) -> float:
    """Output tok/s of one streamed greedy request (first token to last)."""
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    stream = client.completions.create(model="bench", prompt=prompt, max_tokens=tokens,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    first = last = None
    for _ in stream:
        last = time.perf_counter()
        first = first or last
    return (tokens - 1) / (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the core the busy process takes")
    args = parser.parse_args()
    prompt = passages(1)[0]
    servers = {m: VllmServer(str(args.model), "--served-model-name", "bench",
                             "--max-model-len", "2048", env={**os.environ, **MODES[m]})
               for m in args.modes}
    try:
        results = {m: ([], []) for m in args.modes}
        for m, srv in servers.items():
            one_request(srv, prompt, 16)  # warm-up
        for _ in range(args.rounds):
            for m, srv in servers.items():
                quiet, busy = results[m]
                quiet.append(one_request(srv, prompt, args.tokens))
                hog = multiprocessing.Process(target=spin, args=(args.core,), daemon=True)
                hog.start()
                try:
                    time.sleep(0.5)
                    busy.append(one_request(srv, prompt, args.tokens))
                finally:
                    hog.kill()
                    hog.join()
        print(f"{os.cpu_count()} cores; busy process on core {args.core}; "
              f"{args.tokens} tokens, medians of {args.rounds}\n")
        print("| mode | quiet tok/s | busy tok/s | kept |\n|---|---|---|---|")
        for m, (quiet, busy) in results.items():
            q, b = statistics.median(quiet), statistics.median(busy)
            runs = ", ".join(f"{x:.0f}/{y:.0f}" for x, y in zip(quiet, busy))
            print(f"| {m} | {q:.1f} | {b:.1f} | {b / q:.0%} (runs {runs}) |", flush=True)
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
