"""Image-prompt time to first token: ours (vllm.LLM in this process, as `vllm serve`
runs it) against transformers' own forward of the same checkpoint (torch on the
same cores), and how much of it is the vision tower.

    python benchmarks/bench_vision.py [--shape qwen2-vl-2b] [--side 448] [--runs 3]

A random-weight float32 checkpoint of the real model's shape (Qwen2-VL-2B-Instruct:
a 32-layer 1280-wide ViT and a 28 x 1536 Qwen2), written to the bench cache on
first use with the tiny models' tokenizer and the real image processor settings.
The prompt: one chat turn with a side x side picture (448: 1024 patches, 256 image
tokens) and a sentence. Each run is a new picture (no encoder-cache or prefix hit);
median of --runs after one warm-up. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from benchmarks.bench_embeddings import CACHE  # noqa: E402 (the bench cache's models)

SHAPES = {
    "qwen2-vl-2b": dict(
        text=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                   "mrope_section": [16, 24, 24]}),
        vision=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_chans=3)),
}
PROMPT = "What is in the picture? Describe it in one sentence."


def checkpoint(name: str) -> Path:
    """Writes the checkpoint tensor by tensor (the model is built on the meta device),
    so its float32 weights are never held twice."""
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import save_file

    from tests.tiny_models import _train_tokenizer
    from tests.vlm_models import _TOKENS, _init, _write_processor, _write_tokenizer

    path = CACHE / f"vlm-{name}"
    if (path / "done").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    spec = SHAPES[name]
    tokenizer = _train_tokenizer(1024)
    added, placeholder = _TOKENS["qwen2_5_vl"]
    tokenizer.add_special_tokens(added)
    ids = {t: tokenizer.token_to_id(t) for t in added}
    text = transformers.Qwen2VLTextConfig(**spec["text"], vocab_size=151936,
                                          bos_token_id=0, eos_token_id=1, pad_token_id=2)
    config = transformers.Qwen2VLConfig(
        text_config=text.to_dict(), vision_config=spec["vision"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)
    with torch.device("meta"):
        model = transformers.Qwen2VLForConditionalGeneration(config)
    rng = np.random.default_rng(0)
    shard, size, index, n = {}, 0, {}, 0
    for key, p in model.state_dict().items():
        if key == "lm_head.weight":   # tied to the embeddings
            continue
        shard[key] = _init(key, np.zeros(p.shape, np.float32), rng, 151936, [])
        size += shard[key].nbytes
        if size > 2 << 30:
            n += 1
            save_file(shard, str(path / f"model-{n:05d}.safetensors"))
            index.update({k: f"model-{n:05d}.safetensors" for k in shard})
            shard, size = {}, 0
    n += 1
    save_file(shard, str(path / f"model-{n:05d}.safetensors"))
    index.update({k: f"model-{n:05d}.safetensors" for k in shard})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}))
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    config.save_pretrained(path)
    _write_tokenizer(path, tokenizer, placeholder, config)
    _write_processor(path, "qwen2_5_vl")
    # The real model's processor bounds (4 to 16384 merged patches).
    pre = json.loads((path / "preprocessor_config.json").read_text())
    pre.update(min_pixels=56 * 56, max_pixels=28 * 28 * 1280,
               size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
               image_processor_type="Qwen2VLImageProcessor")
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    (path / "processor_config.json").write_text(json.dumps({"processor_class":
                                                            "Qwen2VLProcessor"}))
    (path / "done").write_text("")
    return path


def ours(path: Path, side: int, runs: int) -> dict:
    from vllm import LLM, SamplingParams

    from tests.vlm_models import make_image
    from vllm_metal.models import vision

    llm = LLM(model=str(path), max_model_len=4096, max_num_seqs=4, seed=0)
    spent = []
    encode = vision.VisionTower.encode

    def timed(self, items):
        start = time.perf_counter()
        out = encode(self, items)
        import mlx.core as mx

        mx.eval(out)
        spent.append(time.perf_counter() - start)
        return out

    vision.VisionTower.encode = timed
    params = SamplingParams(max_tokens=1, temperature=0.0)
    ttft, prompt_len = [], 0
    for i in range(runs + 1):
        chat = [{"role": "user", "content": [
            {"type": "image_pil", "image_pil": make_image(100 + i, (side, side))},
            {"type": "text", "text": PROMPT}]}]
        start = time.perf_counter()
        out, = llm.chat(chat, params, use_tqdm=False)
        if i:
            ttft.append(time.perf_counter() - start)
        prompt_len = len(out.prompt_token_ids)
    vision.VisionTower.encode = encode
    return {"ttft": statistics.median(ttft), "tower": statistics.median(spent[1:]),
            "prompt": prompt_len}


def reference(path: Path, side: int, runs: int) -> dict:
    import torch
    import transformers

    from tests.vlm_models import make_image

    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32).eval()
    proc = transformers.AutoProcessor.from_pretrained(path)
    times = []
    for i in range(runs + 1):
        chat = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": PROMPT}]}]
        text = proc.apply_chat_template(chat, add_generation_prompt=True)
        inputs = proc(text=text, images=make_image(100 + i, (side, side)),
                      return_tensors="pt")
        start = time.perf_counter()
        with torch.no_grad():
            model(**inputs)
        if i:
            times.append(time.perf_counter() - start)
    return {"ttft": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2-vl-2b", choices=sorted(SHAPES))
    ap.add_argument("--side", type=int, default=448)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()
    path = checkpoint(args.shape)
    got = ours(path, args.side, args.runs)
    ref = None if args.no_reference else reference(path, args.side, args.runs)
    print("| shape | picture | prompt tokens | TTFT (ours) | of it the tower | "
          "transformers forward |")
    print("|---|---|---|---|---|---|")
    reference_ms = "-" if ref is None else f"{ref['ttft'] * 1e3:.0f} ms"
    print(f"| {args.shape} | {args.side} x {args.side} | {got['prompt']} | "
          f"{got['ttft'] * 1e3:.0f} ms | {got['tower'] * 1e3:.0f} ms | {reference_ms} |")


if __name__ == "__main__":
    main()
