"""Micro-benchmark: vllm-metal's CPU linear ops against MLX's own, with the machine's limits.

Prints markdown tables (pasted into docs/benchmarks.md, "CPU kernels"):

1. machine limits measured here: DRAM read bandwidth (the suite's numpy maxima
   over 2 GiB, 1 and 2 threads, median of 5 sweeps) and fp32 matmul GFLOP/s
   (numpy's BLAS, 2048^3);
2. quantized matmul (4-bit, group 32, fp32 scales: the bundled SmolLM2 GGUF
   as loaded) at SmolLM2's shapes for M = 1, 4, 16, 256 rows, ours vs
   ``mx.quantized_matmul``; dense fp32 / bf16-weight matmul at two shapes;
3. with ``--decode``: one SmolLM2 decode step (1 token, 256 tokens of context)
   through the paged runner path, with and without the fast path.

Weights are cycled through enough copies (> 128 MiB) that every GEMV call reads
them from DRAM, as a decode step does. Each call is one MLX graph node evaluated
with the others of its round, so the times include MLX's per-op overhead. The
figure is the best of the rounds: the machine is shared, and the minimum is the
least disturbed.

    python benchmarks/bench_cpu_kernels.py [--rounds 5] [--decode] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np

from benchmarks.suite.machine import read_bandwidth
from vllm_metal.native import get_ops

# (K, N): q/o, k/v, gate/up, down projections and the tied lm_head of SmolLM2-135M.
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]
ROWS = (1, 4, 16, 256)
COLD_BYTES = 128 << 20
BITS, GROUP = 4, 32


def best_time(fn, rounds: int) -> float:
    """Seconds of the fastest of `rounds` evaluated calls of fn() (after one warm-up)."""
    mx.eval(fn())
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - start)
    return best


def start_table(description: str, columns: list[str], rounds: int = 7) -> int:
    """Parse --rounds, print the build line and a markdown table header. Returns rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    args = parser.parse_args()
    ext = get_ops()
    print(f"isa={ext.cpu_isa()} threads={ext.cpu_threads()} mlx={mx.__version__}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    return args.rounds


# -- machine limits ------------------------------------------------------------

def numpy_matmul_gflops(rounds: int, n: int = 2048) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def single_thread_matmul_gflops(rounds: int) -> float:
    # The BLAS reads its thread count at load time: measure in a child process.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    code = ("import sys; sys.path.insert(0, %r); import bench_cpu_kernels as b; "
            "print(b.numpy_matmul_gflops(%d))" % (os.path.dirname(__file__), rounds))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def machine_limits(rounds: int) -> dict[str, float]:
    data = np.ones((2 << 30) // 8, dtype=np.float64)  # written: every page is real
    limits = {"read_1t": read_bandwidth(1, data), "read_2t": read_bandwidth(2, data)}
    del data
    limits["matmul_1t"] = single_thread_matmul_gflops(rounds)
    limits["matmul_all"] = numpy_matmul_gflops(rounds)
    return limits


# -- kernels -------------------------------------------------------------------

def quantized_copies(k: int, n: int, m: int):
    """Enough (w, scales, biases) copies that a GEMV round streams from DRAM."""
    per = n * k * BITS // 8 + 2 * n * (k // GROUP) * 4
    count = max(1, COLD_BYTES // per) if m <= 16 else 1
    copies = []
    for i in range(count):
        w = mx.random.normal((n, k), key=mx.random.key(i)) * 0.05
        copies.append(mx.quantize(w, group_size=GROUP, bits=BITS))
        mx.eval(copies[-1])
    return copies, per


def quantized_row(k, n, m, rounds, with_mlx: bool) -> dict:
    ext = get_ops()
    copies, per = quantized_copies(k, n, m)
    x = mx.random.normal((m, k))
    mx.eval(x)
    ours = best_time(lambda: [ext.quantized_matmul(x, w, s, b, BITS, GROUP) for w, s, b in copies],
                     rounds) / len(copies)
    row = {"k": k, "n": n, "m": m, "ours": ours, "bytes": per, "flop": 2 * m * n * k}
    if with_mlx:
        few = copies[: max(1, min(len(copies), 8))]
        mlx_rounds = 1 if 2 * m * n * k > 2e9 else rounds
        row["mlx"] = best_time(
            lambda: [mx.quantized_matmul(x, w, s, b, transpose=True, group_size=GROUP, bits=BITS)
                     for w, s, b in few], mlx_rounds) / len(few)
    return row


def dense_row(k, n, m, w_dtype, rounds) -> dict:
    ext = get_ops()
    per = n * k * w_dtype.size
    count = max(1, COLD_BYTES // per) if m <= 16 else 1
    ws = [mx.random.normal((n, k), key=mx.random.key(i)).astype(w_dtype) for i in range(count)]
    x = mx.random.normal((m, k))
    mx.eval(ws, x)
    ours = best_time(lambda: [ext.dense_matmul(x, w) for w in ws], rounds) / count
    few = ws[: min(count, 8)]
    theirs = best_time(lambda: [(x @ w.T) for w in few], 1 if m * n * k > 1e8 else rounds)
    return {"k": k, "n": n, "m": m, "ours": ours, "mlx": theirs / len(few), "bytes": per,
            "flop": 2 * m * n * k, "w": str(w_dtype).split(".")[-1]}


def fmt_row(r: dict) -> str:
    ours = r["ours"]
    cells = [f"{r['k']}x{r['n']}", str(r["m"]), f"{ours * 1e6:.1f}",
             f"{r['flop'] / ours / 1e9:.1f}", f"{r['bytes'] / ours / 1e9:.1f}"]
    if "mlx" in r:
        cells += [f"{r['mlx'] * 1e6:.0f}", f"{r['flop'] / r['mlx'] / 1e9:.2f}",
                  f"{r['mlx'] / ours:.0f}x"]
    else:
        cells += ["-", "-", "-"]
    return "| " + " | ".join(cells) + " |"


# -- decode step ----------------------------------------------------------------

def decode_step_ms(fast: bool, context: int, steps: int) -> tuple[float, float]:
    """(median, min) ms of one SmolLM2 decode step through the paged runner path."""
    from decode_loop import decode_steps

    from vllm_metal.cli.bundled import DEFAULT_MODEL
    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.cpu.fast_linears import use_fast_cpu_linears
    from vllm_metal.v1.model_lifecycle import load_model

    loaded = load_model(str(DEFAULT_MODEL.path()), mx.float32, CpuBackend())
    if fast:
        use_fast_cpu_linears(loaded.model)
    times, _ = decode_steps(loaded, context, steps)
    return float(np.median(times)) * 1e3, min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decode", action="store_true", help="also time SmolLM2 decode steps")
    parser.add_argument("--quick", action="store_true", help="skip MLX's (slow) quantized matmul")
    args = parser.parse_args()
    ext = get_ops()
    print(f"isa={ext.cpu_isa()} threads={ext.cpu_threads()} mlx={mx.__version__}\n")

    limits = machine_limits(args.rounds)
    print("| machine limit | measured |\n|---|---|")
    print(f"| DRAM read, 1 thread (numpy max, 2 GiB) | {limits['read_1t']:.1f} GB/s |")
    print(f"| DRAM read, 2 threads | {limits['read_2t']:.1f} GB/s |")
    print(f"| fp32 matmul 2048^3, numpy BLAS 1 thread | {limits['matmul_1t']:.0f} GFLOP/s |")
    print(f"| fp32 matmul 2048^3, numpy BLAS all threads | {limits['matmul_all']:.0f} GFLOP/s |")

    print(f"\nQuantized matmul, {BITS}-bit group {GROUP}, fp32 scales/biases (x fp32):\n")
    print("| K x N | M | ours us | ours GFLOP/s | ours GB/s | MLX us | MLX GFLOP/s | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for k, n in SHAPES:
        for m in ROWS:
            print(fmt_row(quantized_row(k, n, m, args.rounds, not args.quick)), flush=True)

    print("\nDense matmul (x fp32):\n")
    print("| K x N | M | ours us | ours GFLOP/s | ours GB/s | MLX us | MLX GFLOP/s | speedup "
          "| weights |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w_dtype in (mx.float32, mx.bfloat16):
        for k, n in ((576, 1536), (1536, 576)):
            for m in (1, 256):
                r = dense_row(k, n, m, w_dtype, args.rounds)
                print(fmt_row(r)[:-1] + f"| {r['w']} |", flush=True)

    if args.decode:
        print("\nSmolLM2 decode step (1 token, 256 tokens of context, paged runner path):\n")
        print("| path | median ms | min ms |\n|---|---|---|")
        for fast, steps in ((True, 30), (False, 4)):
            med, low = decode_step_ms(fast, 256, steps)
            name = "fast CPU path" if fast else "MLX's own matmuls"
            print(f"| {name} | {med:.1f} | {low:.1f} |", flush=True)


if __name__ == "__main__":
    main()
