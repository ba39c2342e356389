"""The shipped SmolLM2-135M-Instruct Q4_1 GGUF: our MLX model vs transformers' float32 load."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from tests.gguf.reference import transformers_gguf_model, transformers_logits
from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.loader import load_gguf_model
from vllm_metal.gguf.tokenizer import build_tokenizer

# Short: MLX's CPU quantized matmul is slow (~0.1 s per token here).
PROMPT = "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is"


def test_smollm2_logits_match_transformers(smollm2_path):
    ids = build_tokenizer(read_header(smollm2_path).metadata).encode(PROMPT).ids
    model, config = load_gguf_model(smollm2_path, mx.float32)
    assert (config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (30, 9, 3, 64)
    ours = np.array(model(mx.array([ids]))[0])
    ref = transformers_logits(transformers_gguf_model(smollm2_path), ids)
    np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))
    # Same dequantized Q4_1/Q8_0 weights on both sides; fp32 summation order differs.
    assert np.abs(ours - ref).max() < 1e-3 * np.abs(ref).max()
