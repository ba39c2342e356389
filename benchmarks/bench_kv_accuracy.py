"""What each quantized KV format costs in accuracy, the cache alone: transformers'
float32 forward of the bundled SmolLM2 GGUF, teacher-forced along the real texts of
tests/e2e/test_default_accuracy.py, with every key and value row rounded as the
format stores it (after RoPE, as the cache holds them) and read back; compared with
the same forward on an unrounded cache: the mean KL divergence of the next-token
distributions (nats) and the argmax agreement. The rounding comes from the numpy
codecs (tests/ops/kv_quant_np.py for int8 / fp8, tests/ops/rotated_kv_np.py for the
turboquant presets), so a format can be judged before any kernel reads it.

    .venv/bin/python benchmarks/bench_kv_accuracy.py [--protect 2]

--protect N also reports the rotated presets with the first and last N layers left
unrounded (vLLM's turboquant backend can leave those layers uncompressed, its
"boundary protection").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_default_accuracy import TEXTS, _log_softmax  # noqa: E402
from tests.ops.kv_quant_np import decoded_rows  # noqa: E402
from tests.ops import rotated_kv_np  # noqa: E402
from vllm_metal.attention import rotated_kv  # noqa: E402
from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

ROW_FORMATS = {"int8_per_token_head": "int8", "fp8 (e4m3)": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def row_rounding(fmt: str):
    return lambda k, v: (decoded_rows(k, fmt), decoded_rows(v, fmt))


def rotated_rounding(preset: rotated_kv.RotatedPreset):
    return lambda k, v: rotated_kv_np.round_trip(k, v, preset)


def log_probs(model, ids: list[int], rounding, layers: set[int]) -> np.ndarray:
    """[len - 1, vocab] float64 log-probabilities with the cache rows of `layers`
    passed through rounding(k, v) (numpy [..., head_dim] each)."""
    from transformers.cache_utils import DynamicCache

    class RoundingCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if rounding is not None and layer_idx in layers:
                k, v = rounding(key_states.double().numpy(), value_states.double().numpy())
                key_states = torch.from_numpy(np.asarray(k)).to(key_states.dtype)
                value_states = torch.from_numpy(np.asarray(v)).to(value_states.dtype)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    with torch.no_grad():
        out = model(torch.tensor([ids]), past_key_values=RoundingCache(config=model.config),
                    use_cache=True)
    return _log_softmax(out.logits[0, :-1].double().numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protect", type=int, default=2)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = DEFAULT_MODEL.path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 torch_dtype=torch.float32)
    model.eval()
    n_layers = model.config.num_hidden_layers
    every = set(range(n_layers))
    inner = set(range(args.protect, n_layers - args.protect))
    texts = [tokenizer(t, add_special_tokens=False).input_ids for t in TEXTS]
    base = [log_probs(model, ids, None, every) for ids in texts]

    modes = [(name, row_rounding(fmt), every) for name, fmt in ROW_FORMATS.items()]
    for preset in rotated_kv.PRESETS.values():
        modes.append((preset.name, rotated_rounding(preset), every))
        if args.protect:
            modes.append((f"{preset.name}, first/last {args.protect} layers float",
                          rotated_rounding(preset), inner))
    positions = sum(len(b) for b in base)
    print(f"SmolLM2-135M GGUF via transformers float32, {len(texts)} texts, {positions} "
          "positions; each mode against the unrounded cache\n")
    print("| KV rows rounded as | mean KL (nats) | argmax agreement |")
    print("|---|---|---|")
    for name, rounding, layers in modes:
        kl = agree = 0.0
        for ids, ref in zip(texts, base):
            got = log_probs(model, ids, rounding, layers)
            kl += float((np.exp(ref) * (ref - got)).sum(-1).sum())
            agree += float((ref.argmax(-1) == got.argmax(-1)).sum())
        print(f"| {name} | {kl / positions:.4f} | {agree / positions:.3f} |", flush=True)


if __name__ == "__main__":
    main()
