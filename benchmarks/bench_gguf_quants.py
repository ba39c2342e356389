"""GGUF block types -> MLX: decode speed per type, and what Q6_K's 8-bit mapping costs.

For each supported quantized type: MB of file data decoded per second into MLX arrays
(one [4096, 4096] tensor). For Q6_K, the only type converted to the nearest MLX format:
the RMS error it adds (against Q6_K's own dequantized values) relative to Q6_K's own
RMS error against the float weights it was made from, on normal weights and on weights
with heavy tails (Student t, 3 degrees of freedom, as trained LLM weights have).

    .venv/bin/python benchmarks/bench_gguf_quants.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = COLS = 4096


def _encode(weights: np.ndarray, kind: str) -> np.ndarray:
    import gguf

    from tests import gguf_kquants

    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        return gguf_kquants.quantize(weights, kind)
    return gguf.quants.quantize(weights, gguf.GGMLQuantizationType[kind])


def decode_speed(kind: str, weights: np.ndarray) -> float:
    """MB of block data per second through `to_mlx` (best of three)."""
    import gguf
    import mlx.core as mx

    from vllm_metal.gguf.quants import to_mlx

    raw = _encode(weights, kind).reshape(-1)
    qtype = int(gguf.GGMLQuantizationType[kind])
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tensor = to_mlx(raw, qtype, weights.shape)
        mx.eval(list(tensor.arrays.values()))
        best = min(best, time.perf_counter() - start)
    return raw.nbytes / best / 1e6


def q6_k_error(weights: np.ndarray) -> tuple[float, float]:
    """(RMS error of Q6_K vs the weights, RMS error our 8-bit mapping adds to Q6_K)."""
    import gguf
    import mlx.core as mx

    from vllm_metal.gguf.quants import to_mlx

    raw = _encode(weights, "Q6_K")
    q6 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K).reshape(weights.shape)
    arrays = to_mlx(raw.reshape(-1), 14, weights.shape).arrays
    ours = np.array(mx.dequantize(arrays["weight"], arrays["scales"], arrays["biases"],
                                  group_size=32, bits=8))
    return (float(np.sqrt(np.mean((q6 - weights) ** 2))),
            float(np.sqrt(np.mean((ours - q6) ** 2))))


def main() -> None:
    rng = np.random.default_rng(0)
    normal = rng.normal(size=(ROWS, COLS)).astype(np.float32)
    print(f"decode speed, one [{ROWS}, {COLS}] tensor (MB of file data per second):")
    for kind in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"):
        print(f"  {kind:5s} {decode_speed(kind, normal):8.0f} MB/s")
    heavy = rng.standard_t(3, size=(ROWS, COLS)).astype(np.float32)
    print("Q6_K -> 8-bit: RMS error added / Q6_K's own RMS error")
    for name, weights in (("normal", normal), ("student-t(3)", heavy)):
        own, added = q6_k_error(weights)
        print(f"  {name:13s} own {own:.3e}  added {added:.3e}  ratio {added / own:.3f}")


if __name__ == "__main__":
    main()
