"""mlx-lm's own greedy generation and log-probabilities: the reference for parity tests."""

from __future__ import annotations

import functools
from pathlib import Path

import mlx.core as mx
import numpy as np


@functools.lru_cache(maxsize=8)
def load(model_dir: Path):
    """(model, tokenizer). A .gguf file: the model our loader builds (its own tests hold
    it to the file's dequantized values) and the tokenizer written from its metadata."""
    from mlx_lm import load as mlx_lm_load

    if Path(model_dir).suffix != ".gguf":
        return mlx_lm_load(str(model_dir))
    from mlx_lm.utils import load_tokenizer

    from vllm_metal import envs
    from vllm_metal.gguf.loader import load_gguf_model, materialize_hf_dir

    model, config = load_gguf_model(model_dir)
    hf_dir = materialize_hf_dir(model_dir, cache_root=envs.VLLM_METAL_GGUF_CACHE)
    return model, load_tokenizer(hf_dir, eos_token_ids=config.get("eos_token_id"))


def greedy_tokens(model_dir: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Token ids mlx_lm.stream_generate produces greedily (it stops at EOS, as vLLM does)."""
    from mlx_lm import stream_generate

    model, tokenizer = load(model_dir)
    return [int(r.token) for r in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens)]


def greedy_text(model_dir: Path, prompt_ids: list[int], max_tokens: int) -> str:
    _, tokenizer = load(model_dir)
    ids = greedy_tokens(model_dir, prompt_ids, max_tokens)
    eos = set(tokenizer.eos_token_ids)
    return tokenizer.decode([t for t in ids if t not in eos])


def full_logprobs(model_dir: Path, token_ids: list[int], cached: bool = False) -> np.ndarray:
    """log_softmax of the logits at every position of one dense forward: float64 [len, vocab].
    ``cached``: through mlx-lm's prompt cache, so keys and values pass its update
    (where int8_reference rounds them)."""
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(model_dir)
    cache = make_prompt_cache(model) if cached else None
    logits = model(mx.array(token_ids)[None], cache=cache)[0].astype(mx.float32)
    x = np.array(logits, dtype=np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def tokenize(model_dir: Path, text: str) -> list[int]:
    _, tokenizer = load(model_dir)
    return list(tokenizer.encode(text))
