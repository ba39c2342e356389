"""Micro-benchmark: CPU paged attention over key rows against key columns.

The same float16 keys stored both ways (``ops.paged_attention``'s ``key_columns``),
the two calls alternated in one process; per case the fastest call of each layout
over a few rounds, and the largest difference of their outputs.

    python benchmarks/bench_key_columns.py [--block-size 16] [--rounds 3]
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np

from bench_paged_attention import make_inputs, time_call
from vllm_metal import ops
from vllm_metal.native import get_ops
from vllm_metal.ops.reference import rows_as_key_columns

# (name, seq_lens, q_lens, num_heads, num_kv_heads, head_size)
CASES = [
    ("decode 16 x 770, 9/3, D 64", [770] * 16, [1] * 16, 9, 3, 64),
    ("decode 1 x 8192, 32/4, D 64", [8192], [1], 32, 4, 64),
    ("decode 1 x 8192, 32/8, D 128", [8192], [1], 32, 8, 128),
    ("decode 16 x 300, 32/4, D 64", [300] * 16, [1] * 16, 32, 4, 64),
    ("prefill 256 over 256, 9/3", [256], [256], 9, 3, 64),
    ("prefill 2048 over 4096, 32/4", [4096], [2048], 32, 4, 64),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ext = get_ops()
    print(f"float16, block_size={args.block_size}, isa={ext.cpu_isa()}, "
          f"threads={ext.cpu_threads()}")
    print(f"{'case':32s} {'rows ms':>9s} {'columns ms':>11s} {'speedup':>8s} {'max diff':>9s}")
    for name, seq_lens, q_lens, hq, hkv, d in CASES:
        rows = make_inputs(seq_lens, q_lens, hq, hkv, d, args.block_size, mx.float16)
        key_columns = rows_as_key_columns(rows[1])
        mx.eval(key_columns)
        cols = (rows[0], key_columns, *rows[2:])
        calls = 3 if sum(q_lens) > 1000 else 30
        r = c = float("inf")
        for _ in range(args.rounds):
            r = min(r, time_call(ops.paged_attention, rows, calls)[1] * 1e3)
            c = min(c, time_call(lambda *a: ops.paged_attention(*a, key_columns=True), cols,
                                 calls)[1] * 1e3)
        diff = np.abs(np.array(ops.paged_attention(*rows).astype(mx.float32))
                      - np.array(ops.paged_attention(*cols, key_columns=True)
                                 .astype(mx.float32))).max()
        print(f"{name:32s} {r:9.3f} {c:11.3f} {r / c:7.2f}x {diff:9.1e}", flush=True)


if __name__ == "__main__":
    main()
