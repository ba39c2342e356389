"""transformers' own GGUF loading: the independent reference for models and tokenizers."""

from __future__ import annotations

from pathlib import Path


def assert_close_logits(ours, ref, rtol: float) -> None:
    """float [T, vocab] twice: within rtol of ref's largest logit, same argmax rows."""
    import numpy as np

    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= rtol * scale, (np.abs(ours - ref).max(), scale)
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))


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


def mlx_lm_with_gguf_values(path: Path, family: str, **overrides):
    """mlx-lm's own float32 model of `family_source(family, **overrides)` with every
    parameter replaced by the GGUF's values as the `gguf` package dequantizes them
    (converter transforms undone; Q6_K values rounded to the nearest of 256 even steps
    between each 32-weight group's min and max, the documented 8-bit mapping): what the
    loader must reproduce."""
    import gguf
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from tests.gguf_models import (
        FAMILY_ARCHS, family_source, gguf_tensor_name, llama_cpp_permute,
    )

    model, config = load_model(family_source(family, **overrides))
    _, member, permute, norm_offset = FAMILY_ARCHS[family]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, member),
                                     config["num_hidden_layers"])
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    values = []
    def values_of(tensor):
        return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)

    for name, param in tree_flatten(model.parameters()):
        if name.endswith("self_attn.kv_b_proj.weight"):  # DeepSeek-V2: stored split
            layer = name.split(".")[2]
            keys = values_of(stored[f"blk.{layer}.attn_k_b.weight"]).swapaxes(1, 2)
            joined = np.concatenate([keys, values_of(stored[f"blk.{layer}.attn_v_b.weight"])], 1)
            values.append((name, mx.array(joined.reshape(param.shape))))
            continue
        tensor = stored[gguf_tensor_name(names, name)]
        array = values_of(tensor).reshape(param.shape)
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q6_K:
            array = _nearest_8bit(array)
        kind = tensor.name.rsplit(".", 2)[-2]
        if permute and kind in heads:
            order = llama_cpp_permute(np.arange(array.shape[0]), heads[kind])
            restored = np.empty_like(array)
            restored[order] = array
            array = restored
        if norm_offset and name.endswith("norm.weight"):
            array = array - 1.0
        values.append((name, mx.array(array)))
    model.load_weights(values, strict=True)
    return model


def _nearest_8bit(array):
    """In float32, as the loader computes it: Q6_K's lattices put many weights exactly
    half-way between two 8-bit steps, where the precision decides the rounding."""
    import numpy as np

    groups = array.reshape(-1, 32).astype(np.float32)
    low, high = groups.min(1, keepdims=True), groups.max(1, keepdims=True)
    step = (high - low) / np.float32(255)
    levels = np.rint((groups - low) / np.where(step == 0, np.float32(1), step))
    return (levels * step + low).astype(np.float32).reshape(array.shape)
