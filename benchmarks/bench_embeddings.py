"""Embeddings per second at batch 1 and 64, ours (vllm.LLM in this process, as
`vllm serve --runner pooling` runs it) against transformers' own forward on the
same checkpoint (torch on the same cores, a padded batch, the pooling applied).

    python benchmarks/bench_embeddings.py [--shapes minilm bge-base qwen3-0.6b]

Random-weight float32 checkpoints of real models' shapes, written to the bench
cache on first use: all-MiniLM-L6-v2 (BERT, 6 x 384, mean pooling), bge-base
(BERT, 12 x 768, CLS) and Qwen3-Embedding-0.6B (28 x 1024, last token). The texts:
64 paragraphs of the tiny models' corpus, 20-120 words. Batch 1: the 64 texts one
call each (median latency, texts/s); batch 64: one call of all 64 (median of 3).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CACHE = Path(os.environ.get("VLLM_METAL_BENCH_CACHE",
                            Path.home() / ".cache" / "vllm-metal-bench")) / "models"

SHAPES = {
    "minilm": dict(kind="bert", pooling="mean", config=dict(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512)),
    "bge-base": dict(kind="bert", pooling="cls", config=dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512)),
    "qwen3-0.6b": dict(kind="qwen3", pooling="last", config=dict(
        vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0)),
}


def checkpoint(name: str) -> Path:
    import torch
    import transformers

    spec = SHAPES[name]
    path = CACHE / f"embed-{name}"
    if (path / "modules.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if spec["kind"] == "bert":
        from tests.encoder_models import _write_tokenizer

        _write_tokenizer(path, "bert")
        config = transformers.BertConfig(**spec["config"])
        model = transformers.BertModel(config)
    else:
        from tests.tiny_models import make_tiny_model

        tiny = make_tiny_model(path.with_name(path.name + "-tokenizer"), "qwen3")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (path / f).write_bytes((tiny / f).read_bytes())
        config = transformers.Qwen3Config(**spec["config"], bos_token_id=0, eos_token_id=1,
                                          pad_token_id=2)
        model = transformers.Qwen3ForCausalLM(config)
    model.save_pretrained(str(path))
    from tests.pooling_models import write_sentence_transformers_files

    write_sentence_transformers_files(path, spec["config"]["hidden_size"], spec["pooling"],
                                      normalize=True)
    return path


def texts(n: int = 64) -> list[str]:
    from tests.tiny_models import CORPUS

    words = CORPUS.split()
    out, i = [], 0
    for k in range(n):
        length = 20 + (k * 37) % 101
        out.append(" ".join(words[i:i + length]))
        i = (i + length) % (len(words) - 130)
    return out


def ours(path: Path, batch: list[str]) -> tuple[float, float, float]:
    """(median seconds of one text alone, texts/s alone, texts/s as one batch of all)."""
    from vllm import LLM

    llm = LLM(model=str(path), runner="pooling", max_num_seqs=64, max_model_len=512,
              gpu_memory_utilization=0.5, seed=0)
    llm.embed(batch[:4], use_tqdm=False)   # warm
    alone = []
    for t in batch:
        start = time.perf_counter()
        llm.embed([t], use_tqdm=False)
        alone.append(time.perf_counter() - start)
    together = []
    for _ in range(3):
        start = time.perf_counter()
        llm.embed(batch, use_tqdm=False)
        together.append(time.perf_counter() - start)
    del llm
    return statistics.median(alone), len(batch) / sum(alone), len(batch) / statistics.median(
        together)


def reference(path: Path, batch: list[str], pooling: str) -> tuple[float, float, float]:
    """transformers' forward, pooled, normalised; the same three figures."""
    import torch
    import transformers

    torch.set_num_threads(2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()

    def embed(chunk: list[str]):
        enc = tokenizer(chunk, return_tensors="pt", padding=True)
        with torch.inference_mode():
            h = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        if pooling == "cls":
            v = h[:, 0]
        elif pooling == "mean":
            v = (h * mask).sum(1) / mask.sum(1)
        else:
            v = h[torch.arange(h.shape[0]), enc["attention_mask"].sum(1) - 1]
        return torch.nn.functional.normalize(v, dim=-1)

    embed(batch[:4])
    alone = []
    for t in batch:
        start = time.perf_counter()
        embed([t])
        alone.append(time.perf_counter() - start)
    together = []
    for _ in range(3):
        start = time.perf_counter()
        embed(batch)
        together.append(time.perf_counter() - start)
    return statistics.median(alone), len(batch) / sum(alone), len(batch) / statistics.median(
        together)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    batch = texts()
    print("| shape | runner | batch 1: median ms | batch 1: texts/s | batch 64: texts/s |")
    print("|---|---|---|---|---|")
    for name in args.shapes:
        path = checkpoint(name)
        for label, run in (("vllm-metal", lambda: ours(path, batch)),
                           ("transformers (torch)",
                            lambda: reference(path, batch, SHAPES[name]["pooling"]))):
            latency, alone, together = run()
            print(f"| {name} | {label} | {latency * 1000:.1f} | {alone:.1f} | {together:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
