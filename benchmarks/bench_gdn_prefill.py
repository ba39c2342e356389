"""Prefill through the gated delta rule on the CPU: token by token (chunk=0) against the
chunked form (chunk=32 and 64) of ops.gdn.gated_delta.

One request of each length from zero state, at Qwen3-Next's per-layer GDN shape (16 key
heads, 32 value heads, Dk = Dv = 128), q, k, v in float32 or bfloat16 (gates and beta
float32, states float32 in the pages either way). Each cell is the median of --repeats
timed calls after one warm-up, on the CPU stream with the extension's thread pool; the
speedup is the recurrence's time over the chunked form's.

    .venv/bin/python benchmarks/bench_gdn_prefill.py [--lengths 512,2048,8192]
        [--chunks 32,64] [--dtypes float32,bfloat16] [--linear] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from vllm_metal.ops.gdn import gated_delta

HK, HV, DK, DV = 16, 32, 128, 128
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def _median(fn, repeats: int) -> float:
    mx.eval(fn())
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2]


def inputs(rows: int, dtype: mx.Dtype, seed: int = 0) -> tuple:
    """q, k, v (dtype), g, beta, lo, hi, slots, cu_seqlens, has_state for one request."""
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(rows, HK, DK))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q = rng.normal(size=(rows, HK, DK)) / np.sqrt(DK)
    v = rng.normal(size=(rows, HV, DV))
    g = rng.uniform(0.9, 1.0, size=(rows, HV))
    beta = rng.uniform(0.0, 1.0, size=(rows, HV))
    f32 = lambda a: mx.array(a.astype(np.float32))  # noqa: E731
    pages = mx.zeros((2, HV * DV * DK))
    arrays = (f32(q).astype(dtype), f32(k).astype(dtype), f32(v).astype(dtype), f32(g),
              f32(beta), pages, mx.zeros((2, 8)), mx.array([1], dtype=mx.int32),
              mx.array([0, rows], dtype=mx.int32), mx.array([False]))
    mx.eval(*arrays)
    return arrays


def measure(rows: int, dtype: mx.Dtype, chunk: int, delta: bool, repeats: int) -> float:
    args = inputs(rows, dtype)
    return _median(lambda: gated_delta(*args, 0, HV, delta=delta, chunk=chunk), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="512,2048,8192")
    parser.add_argument("--chunks", default="32,64")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--linear", action="store_true",
                        help="the linear mode (delta=False, Mamba2) instead of the delta rule")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    mode = "linear (delta=False)" if args.linear else "delta rule"
    print(f"gated_delta prefill, {mode}, Hk={HK} Hv={HV} Dk={DK} Dv={DV}, one request "
          f"from zero state, CPU")
    header = " | ".join(f"chunk={c} ms (rows/s, speedup)" for c in chunks)
    print(f"| dtype | rows | chunk=0 ms (rows/s) | {header} |")
    print("|---|---|---|" + "---|" * len(chunks))
    for name in args.dtypes.split(","):
        for rows in (int(n) for n in args.lengths.split(",")):
            base = measure(rows, DTYPES[name], 0, not args.linear, args.repeats)
            cells = []
            for chunk in chunks:
                t = measure(rows, DTYPES[name], chunk, not args.linear, args.repeats)
                cells.append(f"{1e3 * t:.1f} ({rows / t:,.0f}, {base / t:.2f}x)")
            print(f"| {name} | {rows} | {1e3 * base:.1f} ({rows / base:,.0f}) | "
                  + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
