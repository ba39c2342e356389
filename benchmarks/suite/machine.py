"""Machine limits measured in the suite's run, and the model's single-stream decode bound.

Run as `python -m benchmarks.suite.machine MODEL.gguf` inside the bench tools venv
(numpy, threadpoolctl, gguf); prints one JSON object. The suite runs it with
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed so numpy uses its best kernels.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SWEEP_BYTES = 2 << 30   # 2 GiB: far past the L3, so a sum streams from DRAM
REPEATS = 5
# How read_bandwidth reads, kept in each record (records before it have none: "sum").
READ_METHOD = "max"
MATMUL_N = 2048


def read_bandwidth(threads: int, data: np.ndarray, repeats: int = REPEATS) -> float:
    """Median read bandwidth in GB/s over `repeats` sweeps: `threads` numpy maxima over
    equal slices of `data` (viewed as uint64).

    A maximum, not a sum: numpy's float64 sum is a pairwise reduction whose adds
    bound it below the memory on some hosts (a 2-core Intel Xeon read 7.7 GB/s per
    thread summing, 13.5 taking the maximum, 13-15 with a C loop of AVX-512 loads;
    two threads 15.8 against 26.6 and 24-28). The median, not the best: on the shared
    VM this was written on, single sweeps now and then read 50-60% faster than the
    ones around them. (For stretches of an hour or so every sweep can read that fast;
    the median keeps those, and the report says the bandwidth of its own run.)
    """
    parts = np.array_split(data.view(np.uint64), threads)
    times = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.max, parts))   # numpy drops the GIL inside the reduction
            times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times) / 1e9


def matmul_gflops(threads: int) -> float:
    """Best-of-5 fp32 GFLOP/s of a 2048^2 numpy matmul with the BLAS limited to `threads`."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    best = float("inf")
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ b   # warm-up: thread pool start, page faults
        for _ in range(REPEATS):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    return 2 * MATMUL_N**3 / best / 1e9


def weight_bytes_per_token(gguf_path: str) -> int:
    """Bytes of weights one decode step reads: every tensor once, except a token embedding
    that is only gathered (one row) because a separate output.weight is the lm_head."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(gguf_path).tensors}
    total = sum(tensors.values())
    if "output.weight" in tensors and "token_embd.weight" in tensors:
        total -= tensors["token_embd.weight"]
    return total


def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} for i in threadpool_info() if i.get("user_api") == "blas"]


def measure(gguf_path: str) -> dict:
    data = np.ones(SWEEP_BYTES // 8, dtype=np.float64)   # written once so every page is real
    limits = {
        "read_gbps_1t": read_bandwidth(1, data),
        "read_gbps_2t": read_bandwidth(2, data),
        "read_method": READ_METHOD,
    }
    del data
    limits["matmul_fp32_gflops_1t"] = matmul_gflops(1)
    limits["matmul_fp32_gflops_2t"] = matmul_gflops(2)
    limits["blas"] = blas_info()
    limits["numpy"] = np.__version__
    limits["weight_bytes_per_token"] = weight_bytes_per_token(gguf_path)
    return with_bound(limits)


def with_bound(limits: dict) -> dict:
    """Add the single-stream decode bound: weight bytes per token over the best read bandwidth
    (on a loaded machine the 2-thread figure can fall below the 1-thread one)."""
    best = max(limits["read_gbps_1t"], limits["read_gbps_2t"])
    return {**limits, "read_gbps_best": best,
            "decode_bound_tok_s": best * 1e9 / limits["weight_bytes_per_token"]}


def best_of(runs: list[dict]) -> dict:
    """Per-metric best of several measurements (limits: the highest each one reached)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1] if runs else {"error": "not measured"}
    merged = dict(good[-1])
    for key in ("read_gbps_1t", "read_gbps_2t", "matmul_fp32_gflops_1t", "matmul_fp32_gflops_2t"):
        merged[key] = max(r[key] for r in good)
    merged["runs"] = len(good)
    return with_bound(merged)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m benchmarks.suite.machine MODEL.gguf")
    print(json.dumps(measure(sys.argv[1])))
