"""transformers' own GGUF loading: the independent reference for models and tokenizers."""

from __future__ import annotations

from pathlib import Path


def transformers_gguf_model(path: Path):
    """transformers' own float32 load of a GGUF (it dequantizes every tensor)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def transformers_gguf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def transformers_logits(model, ids: list[int]):
    """float32 numpy [len(ids), vocab]."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()
