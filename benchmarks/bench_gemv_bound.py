"""Micro-benchmark: is the single-row quantized GEMV bound by the core or by DRAM?

One kernel thread, one row of x, tall matrices (so MLX's ~10 us per node is
noise). Each shape runs twice: "warm", one copy of the weights, which stays in
the caches between calls; "cold", copies cycled through > 128 MiB, so every
call streams them from DRAM as a decode step does. A kernel that runs no
faster warm than cold is bound by its instructions, not by memory; one that
runs faster warm is waiting on DRAM. Output: a markdown table
(docs/benchmarks.md, "Int8 activations").

    python benchmarks/bench_gemv_bound.py [--rounds 7]
"""

from __future__ import annotations

import os

# The pool reads its size once, when the extension first uses it.
os.environ["VLLM_METAL_CPU_THREADS"] = "1"

from benchmarks.bench_cpu_kernels import start_table  # noqa: E402
from benchmarks.bench_int8_linear import timed  # noqa: E402

# (K, N, bits): SmolLM2's layer widths (K = 576 in, K = 1536 for down) and its
# 8-bit head's K, made tall; group 32 as the GGUF loader gives them.
SHAPES = [(576, 16384, 4), (1536, 8192, 4), (576, 16384, 8)]


def gbps(k: int, n: int, bits: int, int8: bool, cold: bool, rounds: int) -> float:
    """Weight bytes read per second (codes, scales and biases), one row of x."""
    seconds, per = timed(k, n, bits, 1, int8, rounds, cold=cold)
    return per / seconds / 1e9


def main() -> None:
    rounds = start_table(__doc__.splitlines()[0], [
        "K x N (bits)", "fp32 x warm GB/s", "fp32 x cold GB/s", "int8 x warm GB/s",
        "int8 x cold GB/s"])
    for k, n, bits in SHAPES:
        cells = [f"{gbps(k, n, bits, int8, cold, rounds):.1f}"
                 for int8 in (False, True) for cold in (False, True)]
        print(f"| {k}x{n} ({bits}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
