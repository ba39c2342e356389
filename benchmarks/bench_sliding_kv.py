"""KV memory of a Gemma-3-shaped model at 8k context: sliding-window layers as
vLLM sliding-window KV (hybrid manager, the default) against all layers as full
attention (``--disable-hybrid-kv-cache-manager``).

The model: gemma3_text, 12 layers in Gemma 3's pattern (5 sliding of window
512, then 1 global), 1 KV head of 64, random weights (tests/family_models.py).
Each mode serves the same requests of ~8k prompt tokens through vllm.LLM's
engine, one step at a time; after every step the blocks in use are read from
vLLM's block pool. Reported: the peak KV bytes in use (blocks in use x bytes
per block id, which differ between the modes). A sliding group holds a whole
prefill chunk until the step after it, so the chunk size bounds the saving.

    .venv/bin/python benchmarks/bench_sliding_kv.py [--requests 4] [--prompt 8000] [--chunk 2048]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine in this process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.family_models import make_family_model  # noqa: E402

CONTEXT = 8192
LAYERS, PATTERN, WINDOW = 12, 6, 512
KV_MEMORY = 256 * 2**20


def run(model_dir: Path, hybrid: bool, requests: int, prompt: int, chunk: int) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), max_model_len=CONTEXT, block_size=16, max_num_seqs=requests,
              kv_cache_memory_bytes=KV_MEMORY, enable_prefix_caching=False, seed=0,
              max_num_batched_tokens=chunk,
              disable_hybrid_kv_cache_manager=not hybrid)
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    pool = core.scheduler.kv_cache_manager.block_pool
    config = core.scheduler.kv_cache_config
    total = pool.num_gpu_blocks - 1   # block 0 is the null block
    bytes_per_block = KV_MEMORY / config.num_blocks
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for i in range(requests):
        ids = [(7 * i + 13 * j) % 900 + 50 for j in range(prompt)]
        engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=ids), params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, total - pool.get_num_free_blocks())
    result = dict(mode="sliding-window KV (hybrid)" if hybrid else "all full attention",
                  groups=len(config.kv_cache_groups), blocks=config.num_blocks,
                  bytes_per_block=bytes_per_block, peak_blocks=peak,
                  peak_bytes=peak * bytes_per_block)
    del llm
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=8000)
    parser.add_argument("--chunk", type=int, default=2048,
                        help="--max-num-batched-tokens: prefill chunk size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_family_model(
            Path(tmp) / "gemma3", "gemma3_text", num_hidden_layers=LAYERS,
            sliding_window=WINDOW, sliding_window_pattern=PATTERN, num_key_value_heads=1,
            max_position_embeddings=CONTEXT)
        rows = [run(model_dir, hybrid, args.requests, args.prompt, args.chunk)
                for hybrid in (False, True)]
    print(f"{args.requests} requests of {args.prompt} prompt + 32 output tokens, "
          f"{KV_MEMORY / 2**20:.0f} MiB of KV cache, prefill chunks of {args.chunk}\n")
    print("| mode | KV cache groups | block ids | KiB per block id | peak block ids in use "
          "| peak KV in use | per request |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['groups']} | {r['blocks']} | {r['bytes_per_block'] / 1024:.0f} "
              f"| {r['peak_blocks']} | {r['peak_bytes'] / 2**20:.1f} MiB "
              f"| {r['peak_bytes'] / args.requests / 2**20:.1f} MiB |")
    print(f"\nsliding-window KV uses {rows[0]['peak_bytes'] / rows[1]['peak_bytes']:.2f}x less "
          "KV memory at this context")


if __name__ == "__main__":
    main()
