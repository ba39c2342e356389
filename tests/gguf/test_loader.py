"""find_gguf_file, and the HF directory materialize_hf_dir writes for vLLM."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gguf.sample_texts import TEXTS
from tests.gguf_models import hf_dir_for
from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.loader import (
    find_gguf_file,
    gguf_source,
    load_gguf_model,
    materialize_hf_dir,
)
from vllm_metal.gguf.tokenizer import build_tokenizer


def test_find_gguf_file(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    assert find_gguf_file(model) == model
    assert find_gguf_file(tmp_path) == model
    (tmp_path / "notes.txt").write_text("not a model")
    assert find_gguf_file(tmp_path) == model  # other files are ignored


def test_find_gguf_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        find_gguf_file(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="holds no .gguf file"):
        find_gguf_file(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.GGUF").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="holds 2 .gguf files.*a.gguf, b.GGUF"):
        find_gguf_file(tmp_path)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf file"):
        find_gguf_file(other)


def test_load_from_directory(tiny_gguf):
    path = tiny_gguf("qwen2", "Q8_0")
    _, config = load_gguf_model(path.parent)
    assert config["model_type"] == "qwen2"


def test_unknown_architecture_is_refused_everywhere(tiny_gguf, tmp_path):
    path = tiny_gguf("llama", "F32", architecture="gpt2")
    for call in (lambda: load_gguf_model(path),
                 lambda: materialize_hf_dir(path, cache_root=tmp_path)):
        with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
            call()


@pytest.fixture(scope="module")
def tiny_hf_dir(tiny_gguf, tmp_path_factory):
    return materialize_hf_dir(tiny_gguf("llama", "Q4_0"),
                              cache_root=tmp_path_factory.mktemp("cache"))


def test_materialized_dir_loads_in_transformers(tiny_hf_dir, tiny_gguf):
    from transformers import AutoConfig, AutoTokenizer

    source = json.loads((hf_dir_for("llama") / "config.json").read_text())
    config = AutoConfig.from_pretrained(tiny_hf_dir)
    assert config.model_type == "llama"
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim",
                "vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert getattr(config, key) == source[key], key

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dir)
    built = build_tokenizer(read_header(tiny_gguf("llama", "Q4_0")).metadata)
    for text in TEXTS:
        assert tokenizer.encode(text) == built.encode(text).ids
    # The file asks for BOS: exactly one, from the post-processor.
    assert tokenizer.encode("Hello")[:2].count(tokenizer.bos_token_id) == 1
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                           tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|user|>\nHi</s>\n<|assistant|>\n"


def test_materialized_dir_loads_in_vllm(tiny_hf_dir):
    from vllm.transformers_utils.config import get_config

    config = get_config(str(tiny_hf_dir), trust_remote_code=False)
    assert config.model_type == "llama"
    assert config.num_attention_heads == 2 and config.head_dim == 64
    generation = json.loads((tiny_hf_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (
        config.bos_token_id, config.eos_token_id)


def test_materialize_is_idempotent_and_keyed_by_mtime(tiny_gguf, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(tiny_gguf("qwen3", "F16").read_bytes())
    first = materialize_hf_dir(path, cache_root=tmp_path / "cache")
    stamp = (first / "config.json").stat().st_mtime_ns
    assert materialize_hf_dir(tmp_path, cache_root=tmp_path / "cache") == first
    assert (first / "config.json").stat().st_mtime_ns == stamp  # not rewritten
    assert gguf_source(first) == path.resolve()
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert materialize_hf_dir(path, cache_root=tmp_path / "cache") != first


def test_concurrent_materialize_publishes_one_complete_dir(tiny_gguf, tmp_path):
    path, root = tiny_gguf("qwen2", "Q4_1"), tmp_path / "cache"
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: materialize_hf_dir(path, cache_root=root), range(6)))
    assert len(set(results)) == 1
    assert [p.name for p in root.iterdir()] == [results[0].name]  # no staging leftovers
    assert json.loads((results[0] / "config.json").read_text())["model_type"] == "qwen2"


def test_damaged_cache_dir_is_rebuilt(tiny_gguf, tmp_path):
    path, root = tiny_gguf("llama", "F32"), tmp_path / "cache"
    target = materialize_hf_dir(path, cache_root=root)
    (target / "tokenizer.json").unlink()
    assert materialize_hf_dir(path, cache_root=root) == target
    assert (target / "tokenizer.json").is_file()


def test_default_cache_root_is_under_home(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    target = materialize_hf_dir(tiny_gguf("llama", "F32"))
    assert target.parent == tmp_path / ".cache" / "vllm-metal" / "gguf"


def test_gguf_source_of_other_dir(tmp_path):
    assert gguf_source(tmp_path) is None


def test_smollm2_materialized_tokenizer(smollm2_path, smollm2_hf_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(materialize_hf_dir(smollm2_path, tmp_path))
    for text in TEXTS:
        assert tokenizer.encode(text) == smollm2_hf_tokenizer.encode(text)
    messages = [{"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"


def test_a_pipeline_stage_reads_only_its_layers_tensors(tiny_gguf, monkeypatch):
    # Each stage reads the tensors of its own layers (and the embeddings, final norm and
    # head every stage keeps), and the stages run in turn compute the whole model.
    import mlx.core as mx
    import numpy as np

    from vllm_metal.distributed.pipeline import PipelineStage, StageLink, cut_layers
    from vllm_metal.gguf.header import GGUFHeader
    from vllm_metal.models.adapter import backbone_layers

    path = tiny_gguf("llama", "Q8_0")
    read: list[str] = []
    original = GGUFHeader.read_raw

    def recording(self, name, size):
        read.append(name)
        return original(self, name, size)

    monkeypatch.setattr(GGUFHeader, "read_raw", recording)
    ids = mx.array(np.random.default_rng(0).integers(5, 200, size=(1, 9)), dtype=mx.int32)
    whole, config = load_gguf_model(path)
    layers = config["num_hidden_layers"]
    assert layers >= 2 and {int(n.split(".")[1]) for n in read if n.startswith("blk.")} == set(
        range(layers))
    want = whole(ids)
    sent = None
    for rank in range(2):
        stage, link = PipelineStage.of(layers, rank, 2), StageLink()
        read.clear()
        model, _ = load_gguf_model(
            path, arrange=lambda m: cut_layers(backbone_layers(m), stage, link))
        blocks = {int(n.split(".")[1]) for n in read if n.startswith("blk.")}
        assert blocks == set(range(stage.start, stage.end))
        assert {n for n in read if not n.startswith("blk.")} >= {"token_embd.weight",
                                                                  "output_norm.weight"}
        link.incoming = sent
        out = model(ids)
        if stage.is_last:
            assert mx.array_equal(out, want).item()
        else:
            sent = link.outgoing.reshape(-1, link.outgoing.shape[-1])
            mx.eval(sent)


def test_a_tensor_rank_keeps_each_layers_slices_before_the_next_layer_is_read(tiny_gguf,
                                                                              monkeypatch):
    # settle (a tensor rank's shard) runs on each layer once its tensors are in and
    # before the next layer's are read, and gives what sharding the loaded model gives.
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from vllm_metal.distributed.tensor import TensorShard, shard_layer, shard_model
    from vllm_metal.gguf.header import GGUFHeader
    from vllm_metal.models.adapter import backbone_layers

    path = tiny_gguf("llama", "Q8_0")
    events: list[tuple[str, int]] = []
    original = GGUFHeader.read_raw

    def recording(self, name, size):
        if name.startswith("blk."):
            events.append(("read", int(name.split(".")[1])))
        return original(self, name, size)

    monkeypatch.setattr(GGUFHeader, "read_raw", recording)
    shard = TensorShard(1, 2, gather=True)

    def settle(index, layer):
        events.append(("settle", index))
        shard_layer(index, layer, shard, "llama")

    streamed, config = load_gguf_model(path, settle=settle)
    layers = config["num_hidden_layers"]
    settled = [events.index(("settle", i)) for i in range(layers)]
    for i in range(layers):
        reads = [n for n, (kind, layer) in enumerate(events) if kind == "read" and layer == i]
        assert reads and max(reads) < settled[i]
        assert i == 0 or min(reads) > settled[i - 1]
    whole, _ = load_gguf_model(path)
    shard_model(backbone_layers(whole), shard, "llama")
    want = dict(tree_flatten(whole.parameters()))
    got = dict(tree_flatten(streamed.parameters()))
    assert got.keys() == want.keys()
    assert all(mx.array_equal(got[k], want[k]).item() for k in want)
