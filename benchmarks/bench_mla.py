"""Multi-head latent attention on the CPU: weight-absorbed attention over the paged
latent cache (what LatentAttention runs) against expanding the latent into per-head
keys and values first (what mlx-lm's modules do for a prompt), for prefill and decode.

Both sides include their up-projections: absorbed = q_nope @ W_UK per head, the paged
MLA op, the output @ W_UV^T, the per-head products through the expert matmul as the
CPU backend serves them (cpu/fast_heads.py); expanded = latent @ W_UK^T and latent @
W_UV^T for every context token, then MLX's scaled_dot_product_attention (causal for a
prompt), as mlx-lm's modules compute a prompt. The
shape is DeepSeek-V2-Lite's attention (16 heads, nope 128, rope 64, v 128, rank 512),
float32, one sequence.

    python benchmarks/bench_mla.py [--heads 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from vllm_metal.ops.experts import expert_matmul
from vllm_metal.ops.mla import latent_cache_write, mla_attention

BLOCK = 16


def _timed(fn, repeats: int) -> float:
    """Median seconds of fn() (evaluated), after one warm-up."""
    mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run(heads: int, nope: int, rope: int, v: int, rank: int, queries: int, context: int,
        repeats: int) -> tuple[float, float]:
    """(absorbed, expanded) seconds for `queries` new rows at the end of a sequence of
    `context` tokens (queries == context: a whole prompt; 1: a decode step)."""
    key = mx.random.key(0)
    k1, k2, k3, k4, k5, k6 = mx.random.split(key, 6)
    w_uk = mx.random.normal((heads, nope, rank), key=k1) / rank ** 0.5
    w_uv = mx.random.normal((heads, v, rank), key=k2) / rank ** 0.5
    latent = mx.random.normal((context, rank), key=k3)
    k_pe = mx.random.normal((context, rope), key=k4)
    q_nope = mx.random.normal((heads, queries, nope), key=k5)
    q_pe = mx.random.normal((heads, queries, rope), key=k6)
    scale = (nope + rope) ** -0.5

    blocks = -(-context // BLOCK)
    cache = mx.zeros((blocks + 1, BLOCK, rank + rope))
    slots = mx.arange(BLOCK, BLOCK + context, dtype=mx.int32)
    cache = latent_cache_write(latent, k_pe, cache, slots)
    mx.eval(cache)
    tables = mx.arange(1, blocks + 1, dtype=mx.int32)[None]
    lens = mx.array([context], dtype=mx.int32)
    cu = mx.array([0, queries], dtype=mx.int32)

    w_uk_rows = mx.contiguous(w_uk.swapaxes(-1, -2))  # [H, rank, nope]: embed_q's layout
    heads_of = mx.repeat(mx.arange(heads, dtype=mx.int32), queries)

    def per_head(x, w):  # x [H, T, k] @ w[h].T
        return expert_matmul(x.reshape(-1, x.shape[-1]), heads_of, w).reshape(
            heads, queries, -1)

    def absorbed():
        q_latent = per_head(q_nope, w_uk_rows).transpose(1, 0, 2)  # [T, H, rank]
        out = mla_attention(q_latent, q_pe.transpose(1, 0, 2), cache, tables, lens, cu, scale)
        return per_head(out.transpose(1, 0, 2), w_uv)  # [H, T, v]

    mask = "causal" if queries > 1 else None

    def expanded():
        keys = latent @ w_uk.swapaxes(-1, -2)  # [H, S, nope]
        values = latent @ w_uv.swapaxes(-1, -2)  # [H, S, v]
        pe = mx.broadcast_to(k_pe, (heads, context, rope))
        k = mx.concatenate([keys, pe], axis=-1)[None]
        q = mx.concatenate([q_nope, q_pe], axis=-1)[None]
        return mx.fast.scaled_dot_product_attention(q, k, values[None], scale=scale,
                                                    mask=mask)[0]

    with mx.stream(mx.cpu):
        return _timed(absorbed, repeats), _timed(expanded, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dims = dict(heads=args.heads, nope=128, rope=64, v=128, rank=512)
    print(f"MLA, {args.heads} heads, nope 128, rope 64, v 128, rank 512, float32, CPU")
    print("| step | queries | context | absorbed ms | expanded ms | expanded / absorbed |")
    print("|---|---|---|---|---|---|")
    cases = [("prefill", n, n) for n in (128, 512, 1024, 2048)]
    cases += [("decode", 1, n) for n in (512, 2048, 8192)]
    for step, queries, context in cases:
        a, e = run(**dims, queries=queries, context=context, repeats=args.repeats)
        print(f"| {step} | {queries} | {context} | {a * 1e3:.2f} | {e * 1e3:.2f} | {e / a:.2f} |")


if __name__ == "__main__":
    main()
