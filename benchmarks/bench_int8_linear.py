"""Micro-benchmark: quantized matmul on fp32 against int8 activations.

Prints a markdown table (docs/benchmarks.md, "Int8 activations"): SmolLM2's
shapes, 4-bit group 32 (the layers; the tied head is 8-bit), M = 1, 4, 16, 256
rows of x, each path with the weights its model load gives it (fp32 scales for
fp32 activations; under VLLM_METAL_CPU_INT8_ACTIVATIONS exact fp16 copies, a
sixth fewer bytes per weight, and the int8 kernels' tile order). Weights are
cycled through > 128 MiB of copies for M <= 16 so every call reads them from
DRAM, as a decode step does; best of the rounds, MLX's per-node overhead
included; all threads of the pool.

    python benchmarks/bench_int8_linear.py [--rounds 7]
"""

from __future__ import annotations

import mlx.core as mx

from benchmarks.bench_cpu_kernels import COLD_BYTES, best_time, start_table
from vllm_metal.native import get_ops
from vllm_metal.ops.linear import tile_quantized

# (K, N, bits): q/o, k/v, gate/up, down projections and SmolLM2's 8-bit tied head.
SHAPES = [(576, 576, 4), (576, 192, 4), (576, 1536, 4), (1536, 576, 4), (576, 49152, 8)]
ROWS = (1, 4, 16, 256)
GROUP = 32


def copies(k: int, n: int, bits: int, cold: bool, scale_dtype: mx.Dtype, tiled: bool):
    """(copies, bytes per copy): enough copies to stream from DRAM when cold, else one."""
    per = n * k * bits // 8 + 2 * n * (k // GROUP) * scale_dtype.size
    count = max(1, COLD_BYTES // per) if cold else 1
    out = []
    for i in range(count):
        w = mx.random.normal((n, k), key=mx.random.key(i)) * 0.05
        q, s, b = mx.quantize(w, group_size=GROUP, bits=bits)
        out.append((q, s.astype(scale_dtype), b.astype(scale_dtype)))
        if tiled:
            out[-1] = tile_quantized(*out[-1])
        mx.eval(out[-1])
    return out, per


def timed(k: int, n: int, bits: int, m: int, int8: bool, rounds: int,
          cold: bool | None = None) -> tuple[float, int]:
    """(seconds per call, weight bytes per call); cold (default: M <= 16) streams W from DRAM."""
    ext = get_ops()
    cold = m <= 16 if cold is None else cold
    ws, per = copies(k, n, bits, cold, mx.float16 if int8 else mx.float32, int8)
    x = mx.random.normal((m, k))
    mx.eval(x)
    t = best_time(lambda: [ext.quantized_matmul(x, w, s, b, bits, GROUP, int8_activations=int8,
                                                tiled=int8)
                           for w, s, b in ws], rounds) / len(ws)
    return t, per


def main() -> None:
    rounds = start_table(__doc__.splitlines()[0], [
        "K x N (bits)", "M", "fp32 x: us", "GB/s", "GFLOP/s", "int8 x: us", "GB/s", "GFLOP/s",
        "speedup"])
    for k, n, bits in SHAPES:
        for m in ROWS:
            t32, b32 = timed(k, n, bits, m, False, rounds)
            t8, b8 = timed(k, n, bits, m, True, rounds)
            flop = 2 * m * n * k
            print(f"| {k}x{n} ({bits}) | {m} | {t32 * 1e6:.1f} | {b32 / t32 / 1e9:.1f} | "
                  f"{flop / t32 / 1e9:.0f} | {t8 * 1e6:.1f} | {b8 / t8 / 1e9:.1f} | "
                  f"{flop / t8 / 1e9:.0f} | {t32 / t8:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
