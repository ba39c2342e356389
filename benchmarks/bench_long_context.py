"""Long prompts and long contexts, ours against llama-server on the same GGUF: time to
first token of a 4k-token prompt, and single-stream decode speed at 512 and 8k tokens
of context (issue 24's targets: TTFT at most 0.5x llama-server's; decode at 8k at
least 0.7x decode at 512).

    python benchmarks/bench_long_context.py [--model PATH] [--servers ours llama-server]
        [--ttft-prompt 4096] [--contexts 512 8192] [--tokens 64] [--rounds 2]

Each server is started alone, warmed up with a short request, then sent one request at
a time: prompts are pseudo-random token ids (a fresh draw per request, so no prefix
cache ever hits), streamed, greedy, ignore_eos. TTFT: the first text chunk of a
2-token request, median of the rounds. Decode: (last chunk - first chunk) /
(chunks - 1) of a `--tokens` request, the best round. llama-server runs one slot with
a context that holds the longest prompt (the suite's 16 slots of 512 tokens would not);
ours runs its defaults with `--max-model-len` to match.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.suite.probe import token_times  # noqa: E402
from benchmarks.suite.process import ServerProcess, free_port  # noqa: E402
from benchmarks.suite.servers.base import Launch  # noqa: E402
from benchmarks.suite.servers.llama_server import LlamaServer  # noqa: E402

CACHE = Path.home() / ".cache" / "vllm-metal-bench"
DEFAULT_MODEL = CACHE / "models" / "random-tinyllama-1.1b-q4_0.gguf"
VOCAB_LOW, VOCAB_HIGH = 100, 40000   # ids every llama-family tokenizer here has


def launch(server: str, model: Path, port: int, context: int) -> Launch:
    if server == "llama-server":
        binary = LlamaServer(CACHE).binary
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run benchmarks/run_suite.py "
                             "--servers llama-server once to build it")
        # It caps the context at the file's trained length; the override lifts that
        # as VLLM_ALLOW_LONG_MAX_MODEL_LEN does for ours.
        return Launch([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                       "-t", "2", "-tb", "2", "-np", "1", "-c", str(context), "--no-webui",
                       "--override-kv", f"llama.context_length=int:{context}"],
                      model_name=model.stem)
    cli = Path(sys.executable).with_name("vllm-metal")
    # TinyLlama's shape declares 2048 positions; the weights are random, so speed is
    # all that positions past it change (llama-server only warns).
    return Launch([str(cli), "serve", str(model), "--served-model-name", "bench",
                   "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(context),
                   "--max-num-seqs", "4"], model_name="bench",
                  env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})


def measure(server: str, model: Path, args, rng: np.random.Generator) -> dict:
    context = max(args.contexts + [args.ttft_prompt]) + args.tokens + 64
    port = free_port()
    spec = launch(server, model, port, context)
    proc = ServerProcess(spec, port, CACHE / "logs" / f"long-context-{server}.log")
    proc.start(1200.0)
    try:
        def prompt(n: int) -> list[int]:
            return [int(x) for x in rng.integers(VOCAB_LOW, VOCAB_HIGH, n)]

        token_times(proc.base_url, spec, "The history of the city begins", 4, 600)
        ttfts = [token_times(proc.base_url, spec, prompt(args.ttft_prompt), 2, 1800)[0]
                 for _ in range(args.rounds)]
        row = {"server": server, "ttft_s": statistics.median(ttfts), "ttfts": ttfts}
        for n in args.contexts:
            best = 0.0
            for _ in range(args.rounds):
                times = token_times(proc.base_url, spec, prompt(n), args.tokens, 1800)
                best = max(best, (len(times) - 1) / (times[-1] - times[0]))
            row[f"decode_{n}"] = best
        return row
    finally:
        proc.stop()
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--servers", nargs="+", default=["ours", "llama-server"])
    parser.add_argument("--ttft-prompt", type=int, default=4096)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 8192])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for server in args.servers:   # each row as soon as its server has run
        rows.append(measure(server, args.model, args, rng))
        print(rows[-1], flush=True)
    short, long = min(args.contexts), max(args.contexts)
    print(f"| server | TTFT, {args.ttft_prompt}-token prompt | "
          + " | ".join(f"decode tok/s at {n}" for n in args.contexts)
          + f" | decode {long} / {short} |")
    print("|---" * (3 + len(args.contexts)) + "|")
    for r in rows:
        rounds = ", ".join(f"{t:.2f}" for t in r["ttfts"])
        print(f"| {r['server']} | {r['ttft_s']:.2f} s ({rounds}) | "
              + " | ".join(f"{r[f'decode_{n}']:.1f}" for n in args.contexts)
              + f" | {r[f'decode_{long}'] / r[f'decode_{short}']:.2f} |")


if __name__ == "__main__":
    main()
