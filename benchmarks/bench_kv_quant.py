"""Quantized KV caches on the bundled model: memory per token, tokens a fixed pool
holds, and decode speed at short and long context, for each --kv-cache-dtype.

Each mode serves the bundled SmolLM2 GGUF through vllm.LLM's engine in this
process, in the default mode (int8 activations), prefix caching off. Decode speed:
output tokens per second of the engine steps after every request has its first
token, best of --repeats, for one request and for --batch requests at once; the
prompts are fixed pseudo-random ids of each --contexts length.

    .venv/bin/python benchmarks/bench_kv_quant.py [--contexts 512 2048] [--tokens 64] [--batch 4]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine in this process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("auto", "int8_per_token_head", "fp8", "fp8_e5m2", "turboquant_4bit_nc",
         "turboquant_k8v4")
POOL = 512 * 2**20


def decode_rate(llm, prompts, tokens: int, repeats: int) -> float:
    """Output tokens per second of the steps after every request has its first token
    (the prefills are over), best of ``repeats``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=1 + tokens, ignore_eos=True)
    best = 0.0
    for attempt in range(repeats):
        counts = {}
        for i, p in enumerate(prompts):
            engine.add_request(f"{attempt}-{i}", TokensPrompt(prompt_token_ids=p), params)
        start = base = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                counts[out.request_id] = len(out.outputs[0].token_ids)
            if start is None and len(counts) == len(prompts) and min(counts.values()) >= 1:
                start, base = time.perf_counter(), sum(counts.values())
        best = max(best, (sum(counts.values()) - base) / (time.perf_counter() - start))
    return best


def run(mode: str, contexts: list[int], tokens: int, batch: int, repeats: int) -> dict:
    from vllm import LLM

    from vllm_metal.cli.bundled import DEFAULT_MODEL

    longest = max(contexts) + tokens + 16
    llm = LLM(model=str(DEFAULT_MODEL.path()), kv_cache_dtype=mode, max_model_len=longest,
              max_num_seqs=batch, kv_cache_memory_bytes=POOL, enable_prefix_caching=False,
              max_num_batched_tokens=max(contexts) * batch, seed=0)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    cache = runner.kv_cache
    result = {"mode": mode, "bytes_per_token": cache.nbytes / (cache.num_blocks * cache.block_size),
              "pool_tokens": cache.num_blocks * cache.block_size}
    for context in contexts:
        for rows in (1, batch):
            prompts = [[(31 * r + 7 * j) % 40000 + 100 for j in range(context)]
                       for r in range(rows)]
            result[f"ctx{context}_c{rows}"] = decode_rate(llm, prompts, tokens, repeats)
    del llm
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    args = parser.parse_args()
    keys = [f"ctx{c}_c{r}" for c in args.contexts for r in (1, args.batch)]
    print(f"| --kv-cache-dtype | bytes/token | tokens in {POOL >> 20} MiB | "
          + " | ".join(f"decode tok/s, {k.replace('_', ' ').replace('ctx', 'context ')}"
                       for k in keys) + " |")
    print("|---" * (3 + len(keys)) + "|", flush=True)
    for mode in args.modes:   # each row as soon as its mode has run
        r = run(mode, args.contexts, args.tokens, args.batch, args.repeats)
        print(f"| {r['mode']} | {r['bytes_per_token']:.0f} | {r['pool_tokens']} | "
              + " | ".join(f"{r[k]:.1f}" for k in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
