"""Micro-benchmark: native paged attention vs the pure-MLX reference.

Cases: decode (16 sequences x 1024 context) for 9q/3kv heads D=64 (SmolLM2-135M)
and 32q/8kv D=128 (Llama-8B class), and one 512-token prefill of each. Prints the
median and minimum time per call (each call evaluated) of both implementations;
the minimum is the figure least disturbed by other processes on the machine.

    python benchmarks/bench_paged_attention.py [--dtype float16] [--iters 20]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from vllm_metal import ops
from vllm_metal.native import get_ops
from vllm_metal.ops.reference import paged_attention_ref

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def make_inputs(seq_lens, q_lens, num_heads, num_kv_heads, head_size, block_size, dtype, seed=0):
    """Random caches and metadata with shuffled (non-contiguous) block ids."""
    rng = np.random.default_rng(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    value_cache = mx.array(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    ids = rng.permutation(num_blocks).astype(np.int32)
    table = np.zeros((len(seq_lens), max(blocks_per_seq)), dtype=np.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = ids[start : start + n]
        start += n
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    query = mx.array(
        rng.standard_normal((int(cu[-1]), num_heads, head_size), dtype=np.float32)).astype(dtype)
    args = (query, key_cache, value_cache, mx.array(table),
            mx.array(np.array(seq_lens, dtype=np.int32)), mx.array(cu), head_size**-0.5)
    mx.eval(*[a for a in args if isinstance(a, mx.array)])
    return args


def time_call(fn, args, iters):
    """(median, min) seconds per evaluated call."""
    mx.eval(fn(*args))  # warm-up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        mx.eval(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    ext = get_ops()
    print(f"dtype={args.dtype} block_size={args.block_size} isa={ext.cpu_isa()} "
          f"threads={ext.cpu_threads()}")

    cases = [
        ("decode 16x1024 9q/3kv D=64", [1024] * 16, [1] * 16, 9, 3, 64),
        ("decode 16x1024 32q/8kv D=128", [1024] * 16, [1] * 16, 32, 8, 128),
        ("prefill 512 9q/3kv D=64", [512], [512], 9, 3, 64),
        ("prefill 512 32q/8kv D=128", [512], [512], 32, 8, 128),
    ]
    print(f"{'case':30s} {'native median/min ms':>21s} {'reference median/min ms':>24s} "
          f"{'speedup':>8s}")
    for name, seq_lens, q_lens, hq, hkv, d in cases:
        inputs = make_inputs(seq_lens, q_lens, hq, hkv, d, args.block_size, dtype)
        native = time_call(ops.paged_attention, inputs, args.iters)
        reference = time_call(paged_attention_ref, inputs, max(3, args.iters // 10))
        print(f"{name:30s} {native[0] * 1e3:11.2f} /{native[1] * 1e3:8.2f} "
              f"{reference[0] * 1e3:14.1f} /{reference[1] * 1e3:8.1f} "
              f"{reference[0] / native[0]:7.1f}x")


if __name__ == "__main__":
    main()
