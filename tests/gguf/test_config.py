"""hf_config_from_gguf against the HF config each tiny GGUF was converted from."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.gguf_models import hf_dir_for, llama3_rope_freqs
from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.loader import load_gguf_model
from vllm_metal.gguf.config import hf_config_from_gguf
from vllm_metal.gguf.rope_scaling import llama3_divisors, llama3_from_rope_freqs

SAME_AS_SOURCE = ("architectures", "model_type", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "rope_theta", "max_position_embeddings", "vocab_size",
                  "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")


def with_metadata(header, **changes):
    """A copy of `header` with metadata keys changed (None deletes a key)."""
    metadata = {**header.metadata, **changes}
    return dataclasses.replace(
        header, metadata={k: v for k, v in metadata.items() if v is not None})


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_config_matches_source_checkpoint(tiny_gguf, family):
    source = json.loads((hf_dir_for(family) / "config.json").read_text())
    config = hf_config_from_gguf(read_header(tiny_gguf(family, "Q8_0")))
    for key in SAME_AS_SOURCE:
        assert config[key] == source[key], key
    assert config["rms_norm_eps"] == pytest.approx(source["rms_norm_eps"])
    assert config["rope_scaling"] is None


@pytest.mark.parametrize("qtype,dtype", [("F32", "float32"), ("BF16", "bfloat16"),
                                         ("F16", "float16"), ("Q4_0", "float16")])
def test_torch_dtype_follows_tensor_types(tiny_gguf, qtype, dtype):
    assert hf_config_from_gguf(read_header(tiny_gguf("qwen2", qtype)))["torch_dtype"] == dtype


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_rope_scaling_from_metadata(tiny_gguf, kind):
    source = json.loads((hf_dir_for("llama", kind) / "config.json").read_text())
    config = hf_config_from_gguf(read_header(tiny_gguf("llama", "F32", rope_scaling=kind)))
    assert config["rope_scaling"] == source["rope_scaling"]


def test_llama3_rope_scaling_from_rope_freqs(tiny_gguf):
    source = json.loads((hf_dir_for("llama", "llama3") / "config.json").read_text())
    path = tiny_gguf("llama", "F32", rope_scaling="llama3")
    config = hf_config_from_gguf(read_header(path))
    scaling = config["rope_scaling"]
    assert scaling["rope_type"] == "llama3"
    assert scaling["factor"] == source["rope_scaling"]["factor"]
    dims, base = config["head_dim"], config["rope_theta"]
    np.testing.assert_allclose(llama3_divisors(dims, base, scaling),
                               llama3_divisors(dims, base, source["rope_scaling"]), rtol=1e-5)
    load_gguf_model(path)  # rope_freqs.weight is consumed by the config, not refused


@pytest.mark.parametrize("dims,base,factor,low,high,original", [
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),  # Llama 3.1 8B
    (64, 500000.0, 32.0, 1.0, 4.0, 8192),  # Llama 3.2 1B
    (64, 10000.0, 4.0, 2.0, 8.0, 2048),
])
def test_llama3_parameters_reproduce_rope_freqs(dims, base, factor, low, high, original):
    given = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
             "high_freq_factor": high, "original_max_position_embeddings": original}
    freqs = llama3_rope_freqs({"rope_scaling": given, "head_dim": dims, "rope_theta": base})
    recovered = llama3_from_rope_freqs(freqs, dims, base)
    np.testing.assert_allclose(llama3_divisors(dims, base, recovered), freqs, rtol=1e-5)


def test_rope_freqs_that_are_not_llama3_are_refused():
    freqs = np.linspace(1.0, 8.0, 32) ** 2  # smooth everywhere: no llama3 bands
    with pytest.raises(ValueError, match="llama3"):
        llama3_from_rope_freqs(freqs, 64, 10000.0)


def test_all_ones_rope_freqs_mean_no_scaling():
    assert llama3_from_rope_freqs(np.ones(32), 64, 10000.0) is None


def test_unknown_rope_scaling_type_is_refused(tiny_gguf):
    header = with_metadata(read_header(tiny_gguf("llama", "F32")),
                           **{"llama.rope.scaling.type": "longrope",
                              "llama.rope.scaling.factor": 4.0})
    with pytest.raises(ValueError, match="'longrope'"):
        hf_config_from_gguf(header)


def test_unknown_architecture_is_refused_by_name(tiny_gguf):
    header = read_header(tiny_gguf("llama", "F32", architecture="gpt2"))
    with pytest.raises(ValueError, match="'gpt2'.*llama, qwen2, qwen3"):
        hf_config_from_gguf(header)


def test_partial_rotary_is_refused(tiny_gguf):
    header = with_metadata(read_header(tiny_gguf("llama", "F32")),
                           **{"llama.rope.dimension_count": 32})
    with pytest.raises(ValueError, match="partial rotary"):
        hf_config_from_gguf(header)


def test_missing_required_key_is_named(tiny_gguf):
    header = with_metadata(read_header(tiny_gguf("qwen2", "F32")),
                           **{"qwen2.block_count": None})
    with pytest.raises(ValueError, match="qwen2.block_count"):
        hf_config_from_gguf(header)


def test_per_layer_arrays(tiny_gguf):
    header = read_header(tiny_gguf("llama", "F32"))
    same = with_metadata(header, **{"llama.attention.head_count_kv": [1, 1]})
    assert hf_config_from_gguf(same)["num_key_value_heads"] == 1
    varying = with_metadata(header, **{"llama.attention.head_count_kv": [1, 2]})
    with pytest.raises(ValueError, match="head_count_kv varies across layers"):
        hf_config_from_gguf(varying)
