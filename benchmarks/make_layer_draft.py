"""Write a draft model for speculative decoding: a model's first N decoder layers.

    python benchmarks/make_layer_draft.py OUT_DIR [--model PATH] [--layers 8]

The draft keeps the target's embeddings, final norm and head and drops every layer
past the first N (early-exit self-speculation): same tokenizer, same vocabulary, a
fraction of the cost per token. The weights stay as stored (a GGUF's quantized blocks
become MLX's affine groups where they map exactly, as the GGUF loader builds them);
the directory is an mlx-lm checkpoint with the target's tokenizer files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL.path())
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import save_model

    from vllm_metal import envs
    from vllm_metal.gguf.loader import load_gguf_model, materialize_hf_dir

    model, config = load_gguf_model(args.model, mx.float32)
    hf_dir = materialize_hf_dir(args.model, cache_root=envs.VLLM_METAL_GGUF_CACHE)
    if not 0 < args.layers < len(model.model.layers):
        raise SystemExit(f"--layers must be 1..{len(model.model.layers) - 1}")
    model.model.layers = model.model.layers[:args.layers]
    config = {**config, "num_hidden_layers": args.layers}
    quantized = {path: (m.group_size, m.bits) for path, m in model.named_modules()
                 if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    if quantized:
        # mlx-lm's format: the most common (group_size, bits), and per-module entries
        # for the others (a GGUF keeps its embeddings at 8 bits beside 4-bit layers).
        kinds = list(quantized.values())
        group_size, bits = max(set(kinds), key=kinds.count)
        config["quantization"] = {"group_size": group_size, "bits": bits, **{
            path: {"group_size": g, "bits": b} for path, (g, b) in quantized.items()
            if (g, b) != (group_size, bits)}}
    args.out.mkdir(parents=True, exist_ok=True)
    save_model(args.out, model)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):
        if (hf_dir / name).exists():
            shutil.copy(hf_dir / name, args.out / name)
    print(f"wrote {args.out}: {args.layers} of the target's layers, "
          f"{config.get('quantization', 'float')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
