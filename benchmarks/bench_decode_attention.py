"""Decode attention on the CPU backend with cold caches, per call, as the decoder stack sees it.

Times `cpu::paged_attention_cpu` itself (through the extension's `debug.time_cpu_paged_attention`: no
MLX graph, no Python per call) on SmolLM2-135M's geometry (9 query heads, 3 KV
heads, head size 64, block size 16, fp32 caches). A real decode step runs 30
layers, each over its own cache, with the weights streaming in between, so no
layer finds its K/V in the CPU caches. The benchmark reproduces that: every
"layer" has its own random pages of one large pool, and the calls cycle through
enough layers that their K/V together exceed the last-level cache several times
over. Prints, per case, the route taken, min / median microseconds per call and
the K/V read rate of the median call.

    python benchmarks/bench_decode_attention.py [--rounds 5] [--route SplitKv] [--smoke]

docs/gqa-decode.md quotes a run. `--smoke` runs one small case once (checks the
script works; its figures mean nothing).
"""

from __future__ import annotations

import argparse

import numpy as np

from vllm_metal.native import get_ops

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 9, 3, 64, 16
# K/V bytes all layers of a case touch together: several times a 32 MiB L3.
COLD_BYTES = 192 << 20
# (name, context per sequence, query rows per sequence)
CASES = [
    ("B=1 ctx 300", [300], [1]),
    ("B=16 ctx 300", [300] * 16, [1] * 16),
    ("B=1 ctx 2000", [2000], [1]),
    ("B=16 ctx 2000", [2000] * 16, [1] * 16),
    ("B=1 ctx 8000", [8000], [1]),
    ("B=16 ctx 8000", [8000] * 16, [1] * 16),
    ("mixed 15x300 + 256-row prefill", [300] * 15 + [512], [1] * 15 + [256]),
]
SMOKE_CASES = [("B=2 ctx 40", [40, 33], [1, 1])]


def make_case(contexts, q_lens, seed=0):
    """(query, key pool, value pool, block tables [layers, seqs, max_blocks], seq_lens, cu_seqlens_q, kv bytes
    per call): each layer owns distinct, shuffled pages of the pool."""
    rng = np.random.default_rng(seed)
    pages = [-(-n // BLOCK_SIZE) for n in contexts]
    row_bytes = NUM_KV_HEADS * HEAD_SIZE * 4
    kv_bytes = 2 * sum(contexts) * row_bytes
    layers = max(2, -(-COLD_BYTES // kv_bytes))
    num_blocks = layers * sum(pages)
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    key = rng.standard_normal(shape, dtype=np.float32)
    value = rng.standard_normal(shape, dtype=np.float32)
    ids = rng.permutation(num_blocks).astype(np.int32).reshape(layers, -1)
    tables = np.zeros((layers, len(contexts), max(pages)), np.int32)
    for layer in range(layers):
        start = 0
        for s, n in enumerate(pages):
            tables[layer, s, :n] = ids[layer, start:start + n]
            start += n
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    query = rng.standard_normal((int(cu[-1]), NUM_HEADS, HEAD_SIZE), dtype=np.float32)
    return query, key, value, tables, np.array(contexts, np.int32), cu, kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="passes over every layer of a case")
    parser.add_argument("--route", choices=["Varlen", "SplitKv", "GqaDecode"], default=None,
                        help="force this route (default: the CPU decision)")
    parser.add_argument("--partition", type=int, default=None, help="keys per partition of a forced route")
    parser.add_argument("--case", action="append", default=None, help="run only cases whose name has this text")
    parser.add_argument("--smoke", action="store_true", help="one small case, one round")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    ext = get_ops()
    cases, rounds = (SMOKE_CASES, 1) if args.smoke else (CASES, args.rounds)
    if args.case:
        cases = [c for c in cases if any(text in c[0] for text in args.case)]
    print(f"isa={ext.cpu_isa()} threads={ext.cpu_threads()} route={args.route or 'decided'}")
    print(f"{'case':32s} {'route':>10s} {'layers':>6s} {'min us':>9s} {'median us':>9s} {'GB/s':>6s}")
    if args.route:
        ext.debug.force_paged_route(args.route, args.partition or ext.PARTITION_SIZE)
    try:
        for name, contexts, q_lens in cases:
            query, key, value, tables, seq_lens, cu, kv_bytes = make_case(contexts, q_lens)
            scale = HEAD_SIZE**-0.5
            ext.debug.time_cpu_paged_attention(query, key, value, tables, seq_lens, cu, scale, 1)  # warm-up
            times, route = ext.debug.time_cpu_paged_attention(query, key, value, tables, seq_lens, cu, scale, rounds)
            median = float(np.median(times))
            print(f"{name:32s} {route:>10s} {tables.shape[0]:6d} {min(times) * 1e6:9.1f} {median * 1e6:9.1f} "
                  f"{kv_bytes / median / 1e9:6.1f}")
    finally:
        ext.debug.force_paged_route(None)


if __name__ == "__main__":
    main()
