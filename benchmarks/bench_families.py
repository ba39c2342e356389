"""Decode speed of every listed family at one size, against llama of that size.

Each family gets a random-weight ~135M-parameter checkpoint (SmolLM2-135M's
shape: 30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocab
49152), MLX 4-bit (group 64) as mlx-community ships small models, built by
mlx-lm's own classes (tests/family_models.py). The timed loop is the runner's
forward: a 128-token prompt, then single-sequence decode steps through the
paged cache, the family's head and an argmax; the median step is reported.

    .venv/bin/python benchmarks/bench_families.py [--steps 64] [--families a,b]
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

from tests.family_models import FAMILIES, make_family_model  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 576, 30, 9, 3, 64, 1536, 49152
PROMPT = 128


def size_135m(family: str) -> dict:
    """Config overrides giving ``family`` SmolLM2-135M's shape."""
    dims = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=INTER,
                vocab_size=VOCAB)
    if family == "gpt2":
        return dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB)
    if family == "gpt_bigcode":
        return dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTER,
                    vocab_size=VOCAB)
    if family == "phi":   # multi-head attention only
        return {**dims, "num_key_value_heads": HEADS}
    if family == "gemma3":
        text = dict(FAMILIES["gemma3"][1]["text_config"])
        text.update({k: v for k, v in dims.items() if k != "vocab_size"})
        return dict(text_config=text, vocab_size=VOCAB)
    if family in ("gemma3_text", "cohere2", "exaone4", "olmo3", "ministral3", "gemma4_text"):
        extra = {"sliding_window": 512}
        if family == "exaone4":
            extra["sliding_window_pattern"] = "LLLG"
        if family in ("gemma3_text",):
            extra["sliding_window_pattern"] = 6
        if family == "ministral3":
            extra["layer_types"] = ["sliding_attention", "full_attention"] * (LAYERS // 2)
        if family == "gemma4_text":
            extra.update(sliding_window_pattern=5, num_kv_shared_layers=10,
                         vocab_size_per_layer_input=VOCAB)
        if family == "cohere2":
            extra["sliding_window_pattern"] = 4
        return {**dims, **extra}
    return dims


def decode_tok_s(path: Path, steps: int) -> tuple[float, str, int]:
    """(median decode tok/s, compute path, graph nodes of one step) of the model at ``path``."""
    from decode_loop import decode_steps

    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.v1.model_lifecycle import load_model

    loaded = load_model(str(path), mx.float32, CpuBackend())
    times, nodes = decode_steps(loaded, PROMPT, steps)
    route = "decoder stack" if loaded.backbone.stack is not None else "module path"
    return 1.0 / float(np.median(times)), route, nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--families", default=",".join(sorted(FAMILIES)))
    args = parser.parse_args()
    families = args.families.split(",")
    if "llama" in families:
        families.remove("llama")
    families.insert(0, "llama")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            path = make_family_model(Path(tmp) / family, family, quantize_bits=4,
                                     **size_135m(family))
            params = sum(f.stat().st_size for f in path.glob("*.safetensors"))
            tok_s, route, nodes = decode_tok_s(path, args.steps)
            rows.append((family, tok_s, route, nodes, params))
            print(f"{family}: {tok_s:.1f} tok/s ({route}, {nodes} nodes)", file=sys.stderr,
                  flush=True)
    llama = rows[0][1]
    print("| family | decode tok/s | vs llama | path | graph nodes per step | checkpoint MiB |")
    print("|---|---|---|---|---|---|")
    for family, tok_s, route, nodes, size in rows:
        print(f"| {family} | {tok_s:.1f} | {tok_s / llama:.0%} | {route} | {nodes} "
              f"| {size / 2**20:.0f} |")


if __name__ == "__main__":
    main()
