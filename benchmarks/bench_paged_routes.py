"""Long-context decode on the CPU backend: each paged-attention route timed on the same batch.

The CPU backend follows the dispatch routes of the Metal path: GqaDecode (work
items of sequence x partition; the query heads of a group share every K/V row
they decode), SplitKv (the general kernel with the context cut into
partitions, merged afterwards) and Varlen (one work item per sequence and row
chunk, no split). `auto` is what the dispatch decides. The routes alternate
call by call; prints min / median ms per evaluated call and the speedup of the
minimum over Varlen's (the minimum is least disturbed by other processes on the
machine); docs/gqa-decode.md quotes a run. `--smoke` runs one short case once
(checks that the script works; its figures mean nothing).

    python benchmarks/bench_paged_routes.py [--dtype float16] [--iters 40] [--smoke]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from vllm_metal import ops
from vllm_metal.native import constants, get_ops

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
PARTITION = constants.PARTITION_SIZE
ROUTES = [("Varlen", None), ("SplitKv", PARTITION), ("GqaDecode", PARTITION), ("auto", None)]
# (name, contexts, query heads, KV heads, head size)
CASES = [
    ("1 x 8k, 32q/8kv D=128", [8192], 32, 8, 128),
    ("1 x 32k, 32q/8kv D=128", [32768], 32, 8, 128),
    ("2 x 16k, 16q/2kv D=128", [16384, 16384], 16, 2, 128),
    ("1 x 16k, 24q/4kv D=256", [16384], 24, 4, 256),
    ("8 x 4k, 32q/8kv D=128", [4096] * 8, 32, 8, 128),
]
SMOKE_CASES = [("1 x 1.1k, 32q/8kv D=128", [1100], 32, 8, 128)]


def decode_inputs(contexts, num_heads, num_kv_heads, head_size, block_size, dtype, seed=0):
    """One query row per sequence over shuffled pages of random K/V."""
    rng = np.random.default_rng(seed)
    pages = [-(-n // block_size) for n in contexts]
    shape = (sum(pages), block_size, num_kv_heads, head_size)
    key_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    value_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    ids = rng.permutation(sum(pages)).astype(np.int32)
    table = np.zeros((len(contexts), max(pages)), np.int32)
    start = 0
    for i, n in enumerate(pages):
        table[i, :n] = ids[start:start + n]
        start += n
    query = mx.array(rng.standard_normal((len(contexts), num_heads, head_size), dtype=np.float32)).astype(dtype)
    args = (query, key_cache, value_cache, mx.array(table), mx.array(np.array(contexts, np.int32)),
            mx.arange(len(contexts) + 1, dtype=mx.int32), head_size**-0.5)
    mx.eval(query, key_cache, value_cache)
    return args


def time_routes(ext, args, iters):
    """{route: (median, min) seconds per evaluated call, route taken}, routes interleaved
    call by call so that load from other processes hits them alike."""
    times = {route: [] for route, _ in ROUTES}
    taken = {}
    try:
        for i in range(iters + 1):
            for route, partition in ROUTES:
                ext.debug.force_paged_route(None if route == "auto" else route, partition or PARTITION)
                start = time.perf_counter()
                mx.eval(ops.paged_attention(*args))
                if i:  # the first round is a warm-up
                    times[route].append(time.perf_counter() - start)
                taken[route] = ext.debug.last_paged_dispatch()
    finally:
        ext.debug.force_paged_route(None)
    return {r: (float(np.median(t)), min(t), taken[r]) for r, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="one short case, one timed call per route")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    cases, iters = (SMOKE_CASES, 1) if args.smoke else (CASES, args.iters)
    ext = get_ops()
    ext.debug.set_paged_dispatch_diagnostics(True)
    print(f"dtype={args.dtype} block_size={args.block_size} isa={ext.cpu_isa()} threads={ext.cpu_threads()}")
    print(f"{'case':26s} " + " ".join(f"{name:>18s}" for name, _ in ROUTES) +
          "   (min/median ms; speedup of the min over Varlen)")
    for name, contexts, hq, hkv, hd in cases:
        inputs = decode_inputs(contexts, hq, hkv, hd, args.block_size, DTYPES[args.dtype])
        results = time_routes(ext, inputs, iters)
        base = results["Varlen"][1]
        cells = []
        for route, _ in ROUTES:
            median, best, taken = results[route]
            label = f"{best * 1e3:.2f}/{median * 1e3:.2f}"
            if route == "auto":
                label = f"{taken}:{label}"
            cells.append(f"{label:>12s} {base / best:4.1f}x")
        print(f"{name:26s} " + " ".join(cells))


if __name__ == "__main__":
    main()
