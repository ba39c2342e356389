"""Decode step of a mixture-of-experts model against a dense model with the same
active parameters, MLX 4-bit, on the CPU path.

The MoE model is a random-weight qwen3_moe of ~1B parameters: hidden 1536, 12
layers, 12 query / 4 KV heads of 128, 16 experts of intermediate size 1024,
top-2, vocab 32000. The dense model is qwen3 with the same shape and an MLP of
intermediate size 2048: the parameters one MoE token computes with. Both are
built by mlx-lm's own classes (tests/family_models.py), quantized to 4 bits
(group 64). The timed loop is the runner's forward (decode_loop.py): a 128-token
prompt per sequence, then decode steps of 1 and 16 sequences; medians reported.

    .venv/bin/python benchmarks/bench_moe.py [--steps 32] [--batches 1,16] [--ops]

--ops times one expert projection instead: Qwen3-30B-A3B's gate projection (128
experts of 768 x 2048, top-8, MLX 4-bit group 64) for 1-64 tokens, through the
expert matmul and through MLX's own CPU gather_qmm (what mlx-lm's SwitchLinear runs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.family_models import make_family_model  # noqa: E402

SHAPE = dict(hidden_size=1536, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, head_dim=128, vocab_size=32000, tie_word_embeddings=False)
EXPERTS, TOP_K, EXPERT_INTER = 16, 2, 1024
PROMPT = 128


def models(tmp: Path) -> dict[str, Path]:
    moe = make_family_model(tmp / "moe", "qwen3_moe", quantize_bits=4, **SHAPE,
                            num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                            moe_intermediate_size=EXPERT_INTER, intermediate_size=EXPERT_INTER,
                            mlp_only_layers=[], decoder_sparse_step=1)
    dense = make_family_model(tmp / "dense", "qwen3", quantize_bits=4, **SHAPE,
                              intermediate_size=TOP_K * EXPERT_INTER)
    return {"MoE (16 experts, top-2)": moe, "dense, same active parameters": dense}


def params(path: Path) -> tuple[float, float]:
    """(total, active per token) parameters in billions, from the config."""
    import json

    c = json.loads((path / "config.json").read_text())
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    attn = h * c["head_dim"] * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    if "num_experts" in c:
        expert = 3 * h * c["moe_intermediate_size"]
        mlp_total, mlp_active = c["num_experts"] * expert, c["num_experts_per_tok"] * expert
        router = h * c["num_experts"]
    else:
        mlp_total = mlp_active = 3 * h * c["intermediate_size"]
        router = 0
    total = layers * (attn + mlp_total + router) + 2 * vocab * h
    active = layers * (attn + mlp_active + router) + 2 * vocab * h
    return total / 1e9, active / 1e9


def ops_table(reps: int) -> None:
    import time

    from vllm_metal.ops.experts import expert_matmul

    experts, n, k, top = 128, 768, 2048, 8
    w, scales, biases = mx.quantize(mx.random.normal((experts, n, k), key=mx.random.key(0))
                                    * k ** -0.5, group_size=64, bits=4)
    mx.eval(w, scales, biases)

    def best_ms(f, count):
        mx.eval(f())
        times = []
        for _ in range(count):
            start = time.perf_counter()
            mx.eval(f())
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    print("| tokens | pairs | experts read | expert matmul ms | GB/s | MLX gather_qmm ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for tokens in (1, 4, 16, 64):
        rng = np.random.default_rng(tokens)
        idx = mx.array(np.stack([rng.permutation(experts)[:top] for _ in range(tokens)])
                       .astype(np.int32))
        x = mx.random.normal((tokens, k), key=mx.random.key(tokens))
        ours = best_ms(lambda: expert_matmul(x, idx.reshape(-1), w, scales, biases, bits=4,
                                             group_size=64), reps)
        theirs = best_ms(lambda: mx.gather_qmm(x.reshape(tokens, 1, 1, k), w, scales, biases,
                                               rhs_indices=idx, transpose=True, group_size=64,
                                               bits=4), max(3, reps // 8))
        touched = len(set(np.array(idx).ravel().tolist()))
        gbytes = touched * n * (k // 2 + 2 * 4 * k // 64) / 1e9   # codes + fp32 scales/biases
        print(f"| {tokens} | {tokens * top} | {touched} | {ours:.3f} | {gbytes / ours * 1e3:.1f} "
              f"| {theirs:.2f} | {theirs / ours:.0f}x |")


def main() -> None:
    from decode_loop import decode_steps

    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.v1.model_lifecycle import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--ops", action="store_true", help="time one expert projection")
    args = parser.parse_args()
    if args.ops:
        return ops_table(args.steps)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in models(Path(tmp)).items():
            size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
            loaded = load_model(str(path), mx.float32, CpuBackend())
            route = "decoder stack" if loaded.backbone.stack is not None else "module path"
            steps = {}
            for b in batches:
                times, _ = decode_steps(loaded, PROMPT, args.steps, batch=b)
                steps[b] = float(np.median(times))
                print(f"{name} batch {b}: {steps[b] * 1e3:.2f} ms/step", file=sys.stderr,
                      flush=True)
            rows.append((name, *params(path), size, route, steps))
            del loaded
    dense_steps = rows[-1][-1]
    cols = " | ".join(f"step ms, batch {b} | vs dense" for b in batches)
    print(f"| model | params (B) | active (B) | checkpoint MiB | path | {cols} |")
    print("|---|---|---|---|---|" + "---|---|" * len(batches))
    for name, total, active, size, route, steps in rows:
        cells = " | ".join(f"{steps[b] * 1e3:.2f} | {steps[b] / dense_steps[b]:.2f}x"
                           for b in batches)
        print(f"| {name} | {total:.2f} | {active:.2f} | {size / 2**20:.0f} | {route} | {cells} |")


if __name__ == "__main__":
    main()
