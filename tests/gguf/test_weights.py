"""GGUF tensor names, llama Q/K row order, tensor types and BF16 exactness."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.gguf_models import llama_cpp_permute, make_tiny_gguf
from vllm_metal.gguf.loader import load_gguf_model, materialize_hf_dir
from vllm_metal.gguf.metadata import read_gguf
from vllm_metal.gguf.weights import mlx_name, unpermute_rows


@pytest.mark.parametrize("gguf_name,expected", [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("token_embd.scales", "model.embed_tokens.scales"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.biases", "lm_head.biases"),
    ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias"),
    ("blk.11.attn_k.scales", "model.layers.11.self_attn.k_proj.scales"),
    ("blk.2.attn_v.weight", "model.layers.2.self_attn.v_proj.weight"),
    ("blk.2.attn_output.biases", "model.layers.2.self_attn.o_proj.biases"),
    ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
    ("blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"),
    ("blk.4.attn_norm.weight", "model.layers.4.input_layernorm.weight"),
    ("blk.4.ffn_norm.weight", "model.layers.4.post_attention_layernorm.weight"),
    ("blk.5.ffn_gate.weight", "model.layers.5.mlp.gate_proj.weight"),
    ("blk.5.ffn_up.weight", "model.layers.5.mlp.up_proj.weight"),
    ("blk.5.ffn_down.weight", "model.layers.5.mlp.down_proj.weight"),
])
def test_mlx_name(gguf_name, expected):
    assert mlx_name(gguf_name) == expected


@pytest.mark.parametrize("name", ["blk.0.attn_qkv.weight", "blk.0.ffn_gate_exps.weight",
                                  "attn_q.weight", "blk.x.attn_q.weight", "output.extra"])
def test_unknown_tensor_name_is_refused(name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        mlx_name(name)


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


@pytest.mark.parametrize("ggml_type", ["Q5_0", "Q4_K", "Q6_K"])
def test_unsupported_tensor_type_is_refused_naming_the_tensor(tmp_path, ggml_type):
    path = make_tiny_gguf(tmp_path / "model.gguf", "llama", "Q8_0",
                          tensor_types={"blk.1.ffn_down.weight": ggml_type})
    message = rf"'blk\.1\.ffn_down\.weight' has type {ggml_type}.*Q4_0, Q4_1, Q8_0"
    with pytest.raises(ValueError, match=message):
        read_gguf(path)
    with pytest.raises(ValueError, match=message):
        load_gguf_model(path)
    with pytest.raises(ValueError, match=message):
        materialize_hf_dir(path, cache_root=tmp_path / "cache")


def test_bf16_tensors_load_exactly(tiny_gguf):
    import gguf

    path = tiny_gguf("qwen2", "BF16")
    ours = read_gguf(path).tensors["blk.0.ffn_up.weight"]
    assert ours.dtype == mx.bfloat16
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}["blk.0.ffn_up.weight"]
    expected = gguf.quants.dequantize(stored.data, stored.tensor_type)
    np.testing.assert_array_equal(np.array(ours.astype(mx.float32)), expected)
    # mx.load alone rounds through float16: the reason for the exact re-read.
    assert mx.load(str(path))["blk.0.ffn_up.weight"].dtype == mx.float16


def test_quantized_triples_dequantize_like_gguf(tiny_gguf):
    import gguf

    for qtype in ("Q4_0", "Q4_1", "Q8_0"):
        path = tiny_gguf("llama", qtype)
        tensors = read_gguf(path).tensors
        stored = {t.name: t for t in gguf.GGUFReader(path).tensors}["blk.0.ffn_gate.weight"]
        bits = 8 if qtype == "Q8_0" else 4
        ours = mx.dequantize(tensors["blk.0.ffn_gate.weight"], tensors["blk.0.ffn_gate.scales"],
                             tensors["blk.0.ffn_gate.biases"], group_size=32, bits=bits)
        expected = gguf.quants.dequantize(stored.data, stored.tensor_type)
        np.testing.assert_allclose(np.array(ours), expected, rtol=1e-3, atol=1e-3)
