"""Micro-benchmark: the int8-activation matmul with AMX tiles against without.

Prints a markdown table (docs/benchmarks.md, "AMX tiles"): 4-bit group 32
weights in the int8 kernels' tile order with fp16 scales (what a quantized
model's load gives the default path), SmolLM2's and the TinyLlama-1.1B shape's
projections, M rows of x; W streams from DRAM for M <= 16 as in a decode step.
Best of the rounds, all threads of the pool. Needs a CPU with AMX-INT8.

    python benchmarks/bench_amx.py [--rounds 7]
"""

from __future__ import annotations

from benchmarks.bench_cpu_kernels import start_table
from benchmarks.bench_int8_linear import timed
from vllm_metal.native import get_ops

# (K, N): SmolLM2's gate/up and down, TinyLlama-1.1B's q/o, gate/up and down.
SHAPES = [(576, 1536), (1536, 576), (2048, 2048), (2048, 5632), (5632, 2048)]
ROWS = (16, 64, 256, 1024)


def main() -> None:
    ext = get_ops()
    ext.debug.set_cpu_amx(True)  # raises ValueError where there are no tiles
    rounds = start_table(__doc__.splitlines()[0], [
        "K x N", "M", "VNNI: us", "GOP/s", "AMX: us", "GOP/s", "speedup"])
    for k, n in SHAPES:
        for m in ROWS:
            ext.debug.set_cpu_amx(False)
            t_vnni, _ = timed(k, n, 4, m, True, rounds)
            ext.debug.set_cpu_amx(True)
            t_amx, _ = timed(k, n, 4, m, True, rounds)
            ops = 2 * m * n * k
            print(f"| {k}x{n} | {m} | {t_vnni * 1e6:.0f} | {ops / t_vnni / 1e9:.0f} | "
                  f"{t_amx * 1e6:.0f} | {ops / t_amx / 1e9:.0f} | {t_vnni / t_amx:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
