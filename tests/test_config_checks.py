"""Parallel settings the platform cannot run are refused when the engine's config is
made, naming the flag; pipeline, tensor or data parallel alone is accepted, tensor
parallel also where it does not divide the query heads, in every process that
verifies it. Pooling runners that are not served (a bidirectional decoder, pooling
across pipeline stages) are refused by name; so are encoder-decoder models other than
Whisper, and the flags Whisper's runner does not honour."""

from __future__ import annotations

import pytest
from vllm.engine.arg_utils import EngineArgs

from tests.tiny_models import cached_tiny_model


def _config(model_kwargs=None, **kwargs):
    model = str(cached_tiny_model("llama", **(model_kwargs or {})))
    return EngineArgs(model=model, max_model_len=256, **kwargs).create_engine_config()


@pytest.mark.parametrize("kwargs,flag", [
    (dict(tensor_parallel_size=2, pipeline_parallel_size=2), "--tensor-parallel-size 2 with"),
    (dict(tensor_parallel_size=2, enable_lora=True), "--enable-lora"),
    (dict(decode_context_parallel_size=2, tensor_parallel_size=4),
     "--decode-context-parallel-size 2"),
    (dict(data_parallel_size=2, tensor_parallel_size=2), "--data-parallel-size 2"),
    (dict(pipeline_parallel_size=2, enable_lora=True), "--enable-lora"),
    (dict(pipeline_parallel_size=2, kv_offloading_size=1.0), "--kv-offloading-size"),
    (dict(pipeline_parallel_size=2,
          speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                              "prompt_lookup_max": 3}), "--speculative-config"),
])
def test_parallel_settings_we_cannot_run_are_refused_by_flag(kwargs, flag):
    with pytest.raises(Exception, match=flag):
        _config(**kwargs)


@pytest.mark.parametrize("flag", ["pipeline_parallel_size", "tensor_parallel_size",
                                  "data_parallel_size"])
def test_one_kind_of_parallelism_is_accepted(flag):
    config = _config(**{flag: 2})
    assert getattr(config.parallel_config, flag) == 2


def test_tensor_parallel_that_does_not_divide_the_heads_is_accepted_everywhere():
    import pickle

    # 8 query heads over 4 KV heads on 3 ranks: vLLM's own check refuses it.
    config = _config(dict(num_attention_heads=8, num_key_value_heads=4),
                     tensor_parallel_size=3)
    assert config.parallel_config.tensor_parallel_size == 3
    # The engine core gets the config pickled and verifies it again.
    again = pickle.loads(pickle.dumps(config))
    again.__post_init__()
    assert again.parallel_config.tensor_parallel_size == 3


def test_expert_parallel_is_refused_by_flag(tmp_path):
    from tests.family_models import make_family_model

    model = str(make_family_model(tmp_path / "mixtral", "mixtral"))
    with pytest.raises(Exception, match="--enable-expert-parallel"):
        EngineArgs(model=model, max_model_len=256,
                   enable_expert_parallel=True).create_engine_config()


@pytest.mark.parametrize("kwargs,named", [
    (dict(runner="pooling", pipeline_parallel_size=2), "--pipeline-parallel-size 2 with"),
    (dict(runner="pooling", hf_overrides={"is_causal": False}), "bidirectional")])
def test_pooling_runners_we_cannot_serve_are_refused_by_name(kwargs, named):
    with pytest.raises(Exception, match=named) as refused:
        _config(**kwargs)
    assert "LlamaForCausalLM" in str(refused.value)


@pytest.mark.parametrize("kwargs,convert", [(dict(runner="pooling"), "embed"),
                                            (dict(convert="embed"), "embed"),
                                            (dict(convert="classify"), "classify")])
def test_decoder_pooling_runners_are_accepted(kwargs, convert):
    config = _config(**kwargs).model_config
    assert (config.runner_type, config.convert_type) == ("pooling", convert)


def test_the_generate_runner_is_accepted():
    assert _config(runner="generate").model_config.runner_type == "generate"


def test_a_llava_checkpoint_whose_language_model_mlx_lm_would_misbuild_is_refused(tmp_path):
    import json
    import shutil

    from tests.vlm_models import cached_vlm_model

    path = tmp_path / "llava-qwen2"
    shutil.copytree(cached_vlm_model("llava"), path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["model_type"] = "qwen2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="with a qwen2 language model"):
        EngineArgs(model=str(path), max_model_len=256).create_engine_config()
    EngineArgs(model=str(cached_vlm_model("llava")), max_model_len=256).create_engine_config()


@pytest.fixture(scope="module")
def whisper_dir():
    from tests.speech_models import cached_whisper_model

    return cached_whisper_model()


@pytest.mark.parametrize("kwargs,flag", [
    (dict(enable_lora=True), "--enable-lora"),
    (dict(kv_cache_dtype="fp8"), "--kv-cache-dtype fp8"),
    (dict(kv_offloading_size=1.0), "--kv-offloading-size"),
    (dict(tensor_parallel_size=2), "one rank"),
])
def test_whisper_refuses_what_its_runner_does_not_do_by_flag(whisper_dir, kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        EngineArgs(model=str(whisper_dir), max_model_len=64, **kwargs).create_engine_config()
    EngineArgs(model=str(whisper_dir), max_model_len=64).create_engine_config()


def test_an_encoder_decoder_other_than_whisper_is_refused_by_name(whisper_dir, tmp_path):
    import json
    import shutil

    path = tmp_path / "not-whisper"
    shutil.copytree(whisper_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["activation_function"] = "relu"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="other than Whisper.*activation_function 'relu'"):
        EngineArgs(model=str(path), max_model_len=64).create_engine_config()
