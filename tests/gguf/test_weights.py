"""Llama Q/K row order, tensor type refusals and BF16 exactness through the loader."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.gguf_models import llama_cpp_permute, make_tiny_gguf
from vllm_metal.gguf.loader import load_gguf_model, materialize_hf_dir
from vllm_metal.gguf.weights import unpermute_rows


@pytest.mark.parametrize("n_heads,head_dim", [(1, 64), (3, 64), (2, 128), (4, 8)])
def test_unpermute_inverts_llama_cpp_permute(n_heads, head_dim):
    rng = np.random.default_rng(n_heads)
    weight = rng.normal(size=(n_heads * head_dim, 16)).astype(np.float32)
    bias = rng.normal(size=(n_heads * head_dim,)).astype(np.float32)
    packed = rng.integers(0, 2**32, size=(n_heads * head_dim, 4), dtype=np.uint32)
    for original in (weight, bias, packed):
        permuted = mx.array(llama_cpp_permute(original, n_heads))
        np.testing.assert_array_equal(np.array(unpermute_rows(permuted, n_heads)), original)


def test_unpermute_refuses_rows_that_do_not_split():
    with pytest.raises(ValueError, match="heads"):
        unpermute_rows(mx.zeros((6, 4)), 4)


@pytest.mark.parametrize("ggml_type", ["Q2_K", "IQ4_NL", "Q3_K"])
def test_unsupported_tensor_type_is_refused_naming_the_tensor(tmp_path, ggml_type):
    path = make_tiny_gguf(tmp_path / "model.gguf", "llama", "Q8_0",
                          tensor_types={"blk.1.ffn_down.weight": ggml_type})
    message = rf"'blk\.1\.ffn_down\.weight' has type {ggml_type}.*Q4_0, Q4_1, Q5_0"
    with pytest.raises(ValueError, match=message):
        load_gguf_model(path)
    with pytest.raises(ValueError, match=message):
        materialize_hf_dir(path, cache_root=tmp_path / "cache")


def test_bf16_tensors_load_exactly(tiny_gguf):
    import gguf

    path = tiny_gguf("qwen2", "BF16")
    model, _ = load_gguf_model(path, mx.bfloat16)
    ours = model.model.layers[0].mlp.up_proj.weight
    assert ours.dtype == mx.bfloat16
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}["blk.0.ffn_up.weight"]
    expected = gguf.quants.dequantize(stored.data, stored.tensor_type)
    np.testing.assert_array_equal(np.array(ours.astype(mx.float32)), expected)
    # mx.load alone rounds through float16: one reason the loader decodes blocks itself.
    assert mx.load(str(path))["blk.0.ffn_up.weight"].dtype == mx.float16
