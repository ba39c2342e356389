"""Tiny pooling checkpoints and their references from transformers: embedding models
(a tiny decoder plus sentence-transformers' pooling files, as embedding models ship)
and classifiers (a `*ForSequenceClassification` checkpoint with its score matrix).

`make_embedding_model(path, family, pooling=..., normalize=..., bare=...)`: the tiny
model of tests/tiny_models.py with `modules.json` and `1_Pooling/config.json` saying
how sentence-transformers pools it; `bare` saves the decoder alone (keys without the
`model.` prefix, no LM head, architecture `<Family>Model`), as transformers saves an
AutoModel; `matryoshka` adds the config's `matryoshka_dimensions`.
`make_classifier_model(path, family, num_labels=...)`: the tiny decoder saved by
transformers as `<Family>ForSequenceClassification`, its score matrix drawn wide
enough that the labels' probabilities differ.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.tiny_models import cached_build, make_tiny_model

POOLING_MODES = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens",
                 "cls": "pooling_mode_cls_token"}


def write_sentence_transformers_files(path: Path, hidden_size: int, pooling: str,
                                      normalize: bool) -> None:
    """modules.json and 1_Pooling/config.json as sentence-transformers saves a model
    that pools with ``pooling`` (a POOLING_MODES key), then normalises or not."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden_size, POOLING_MODES[pooling]: True}))


def make_embedding_model(path: str | Path, family: str = "qwen3", *, pooling: str = "last",
                         normalize: bool = True, bare: bool = False,
                         matryoshka: list[int] | None = None, **tiny: Any) -> Path:
    path = make_tiny_model(path, family, **tiny)
    config = json.loads((path / "config.json").read_text())
    if bare:
        from safetensors.numpy import load_file, save_file

        weights = load_file(str(path / "model.safetensors"))
        weights = {k.removeprefix("model."): v for k, v in weights.items()
                   if not k.startswith("lm_head.")}
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        config["architectures"] = [config["architectures"][0].replace("ForCausalLM", "Model")]
    if matryoshka:
        config["matryoshka_dimensions"] = matryoshka
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_sentence_transformers_files(path, config["hidden_size"], pooling, normalize)
    return path


def make_classifier_model(path: str | Path, family: str = "qwen3", *, num_labels: int = 1,
                          seed: int = 0, **tiny: Any) -> Path:
    import shutil

    import torch
    import transformers

    path = Path(path)
    source = make_tiny_model(path.with_name(path.name + "-causal"), family, seed=seed, **tiny)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(source), num_labels=num_labels, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=gen) * 0.2)
    model.config.pad_token_id = model.config.eos_token_id
    model.save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, path / name)
    return path


def cached_classifier_model(family: str = "qwen3", **kwargs: Any) -> Path:
    return cached_build(make_classifier_model, family, kwargs)


def cached_embedding_model(family: str = "qwen3", **kwargs: Any) -> Path:
    return cached_build(make_embedding_model, family, kwargs)


class ReferenceEmbedder:
    """transformers' float32 forward of a checkpoint, pooled in float64."""

    def __init__(self, path: str | Path) -> None:
        import torch
        import transformers

        self._torch = torch
        self.model = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32)

    def hidden(self, token_ids: list[int]) -> np.ndarray:
        """float64 [len(token_ids), hidden]: the last hidden states (final norm applied)."""
        torch = self._torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([token_ids])).last_hidden_state[0]
        return out.double().numpy()

    def embed(self, token_ids: list[int], pooling: str, normalize: bool,
              dimensions: int | None = None) -> np.ndarray:
        h = self.hidden(token_ids)
        v = h[-1] if pooling == "last" else h.mean(axis=0)
        if dimensions is not None:
            v = v[:dimensions]
        return v / np.linalg.norm(v) if normalize else v


def reference_logits(path: str | Path, token_ids: list[int], causal: bool = False
                     ) -> np.ndarray:
    """float64 logits of the last token: a classifier's labels, or with ``causal`` the
    LM head's vocabulary (the checkpoint as transformers' causal LM)."""
    import torch
    import transformers

    auto = (transformers.AutoModelForCausalLM if causal
            else transformers.AutoModelForSequenceClassification)
    model = _reference_model(auto, str(path))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([token_ids])).logits[0]
    return (logits[-1] if causal else logits).double().numpy()


@functools.cache
def _reference_model(auto, path: str):
    import torch

    return auto.from_pretrained(path, dtype=torch.float32)


def sigmoid(x) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def softmax(x) -> np.ndarray:
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
