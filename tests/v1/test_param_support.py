"""check_sampling_params / check_sampling_config: one test per refused feature."""

from types import SimpleNamespace

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from vllm_metal.v1 import param_support
from vllm_metal.v1.param_support import check_sampling_config, check_sampling_params


def test_supported_params_pass():
    check_sampling_params(SamplingParams())
    check_sampling_params(SamplingParams(
        temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=3, repetition_penalty=1.2,
        presence_penalty=0.5, frequency_penalty=0.5, logit_bias={1: -100, 2: 3.5},
        allowed_token_ids=[1, 2, 3], bad_words=["x"], min_tokens=2, stop_token_ids=[9],
        logprobs=-1, prompt_logprobs=5, logprob_token_ids=[4, 5], watermarking=False,
        extra_args={"tag": 1}, n=2))


@pytest.mark.parametrize("kw, field", [
    (dict(prompt_logprob_token_ids=[[1, 2]]), "prompt_logprob_token_ids"),
    (dict(thinking_token_budget=16), "thinking_token_budget"),
    (dict(trace_decode_token_ids=[1, 2, 3]), "trace_decode_token_ids"),
    (dict(seed=1.5), "seed"),
    (dict(logit_bias={1: float("inf")}), "logit_bias"),
    (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(logit_bias={"1": 2.0}), "logit_bias"),
])
def test_refused_params(kw, field):
    with pytest.raises(ValueError, match=field) as err:
        check_sampling_params(SamplingParams(**kw))
    assert isinstance(err.value, VLLMValidationError)  # vLLM's server answers 400
    assert err.value.parameter == field


def test_prompt_logprob_start_alone_is_refused():
    params = SamplingParams()
    params.prompt_logprob_start = 2
    with pytest.raises(ValueError, match="prompt_logprob"):
        check_sampling_params(params)


def test_non_sampling_params_are_a_type_error():
    with pytest.raises(TypeError, match="SamplingParams"):
        check_sampling_params({"temperature": 0.5})


def _config(**model):
    fields = dict(logits_processors=None, return_sampling_mask=False,
                  enable_trace_replay=False, use_fp64_gumbel=False)
    return SimpleNamespace(watermark_config=None,
                           model_config=SimpleNamespace(**{**fields, **model}))


@pytest.fixture
def no_plugins(monkeypatch):
    monkeypatch.setattr(param_support, "entry_points", lambda group: [])


@pytest.mark.parametrize("model, flag", [
    (dict(logits_processors=["pkg.mod:Proc"]), "--logits-processors"),
    (dict(return_sampling_mask=True), "--return-sampling-mask"),
    (dict(enable_trace_replay=True), "--enable-trace-replay"),
    (dict(use_fp64_gumbel=True), "--use-fp64-gumbel"),
])
def test_refused_engine_options(no_plugins, model, flag):
    check_sampling_config(_config())
    with pytest.raises(ValueError, match=flag):
        check_sampling_config(_config(**model))


def test_watermark_config_is_refused(no_plugins):
    config = _config()
    config.watermark_config = object()
    with pytest.raises(ValueError, match="--watermark-config"):
        check_sampling_config(config)


def test_installed_logits_processor_plugins_are_refused(monkeypatch):
    plugin = SimpleNamespace(name="my_proc")
    monkeypatch.setattr(param_support, "entry_points",
                        lambda group: [plugin] if group == "vllm.logits_processors" else [])
    with pytest.raises(ValueError, match="my_proc"):
        check_sampling_config(_config())


def test_prompt_logprob_token_ids_array_form_is_refused():
    params = SamplingParams()
    params.prompt_logprob_token_ids = np.array([[1, 2]], dtype=np.int32)
    with pytest.raises(ValueError, match="prompt_logprob_token_ids"):
        check_sampling_params(params)


@pytest.mark.parametrize("engine_input,named", [
    ({"type": "multimodal", "prompt_token_ids": [1, 2, 3],
      "mm_placeholders": {"image": [object()]}, "mm_kwargs": {}}, "image inputs"),
    ({"type": "multimodal", "prompt_token_ids": [1],
      "mm_placeholders": {"audio": [object()], "image": []}, "mm_kwargs": {}}, "audio inputs"),
    ({"type": "embeds", "prompt_embeds": None}, "prompt embeddings"),
    ({"type": "enc_dec", "encoder": {"type": "multimodal", "prompt_token_ids": [1],
                                     "mm_placeholders": {"audio": [object()]}},
      "decoder": {"type": "token", "prompt_token_ids": [1]}}, "audio inputs"),
])
def test_inputs_the_runner_cannot_feed_are_refused(engine_input, named, monkeypatch):
    from vllm_metal.v1 import param_support

    # A text model's process (an earlier test's vision model may have set it).
    monkeypatch.setattr(param_support, "_served_modalities", frozenset())
    with pytest.raises(ValueError, match=named):
        param_support.check_engine_input(engine_input)


def test_text_inputs_pass():
    from vllm_metal.v1.param_support import check_engine_input

    check_engine_input({"type": "token", "prompt_token_ids": [1, 2]})
    check_engine_input({"type": "multimodal", "prompt_token_ids": [1],
                        "mm_placeholders": {}, "mm_kwargs": {}})


def _config_of(model_type: str, language_model_only: bool = False):
    from types import SimpleNamespace

    hf = SimpleNamespace(to_dict=lambda: {"model_type": model_type})
    mm = SimpleNamespace(language_model_only=language_model_only)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf, multimodal_config=mm))


@pytest.mark.parametrize("model_type,served", [("llava", True), ("qwen2_5_vl", True),
                                               ("qwen2_vl", True), ("gemma3", True),
                                               ("qwen3_vl", True), ("idefics3", False),
                                               ("llama", False), ("gemma3", None)])
def test_images_pass_only_for_models_whose_tower_runs_here(model_type, served, monkeypatch):
    # served None: a served type turned language-model-only (no vision weights).
    from vllm_metal.v1 import param_support

    monkeypatch.setattr(param_support, "_served_modalities", frozenset())
    param_support.remember_modalities(_config_of(model_type, language_model_only=served is None))
    image = {"type": "multimodal", "prompt_token_ids": [1, 2],
             "mm_placeholders": {"image": [object()]}, "mm_kwargs": {}}
    audio = {"type": "multimodal", "prompt_token_ids": [1],
             "mm_placeholders": {"audio": [object()]}, "mm_kwargs": {}}
    if served:
        param_support.check_engine_input(image)
    else:
        with pytest.raises(ValueError, match="image inputs are not served"):
            param_support.check_engine_input(image)
    with pytest.raises(ValueError, match="audio inputs"):
        param_support.check_engine_input(audio)


def test_a_checkpoint_without_vision_weights_is_told_apart():
    import json

    from tests.family_models import cached_family_model
    from tests.vlm_models import cached_vlm_model
    from vllm_metal.models.vision import lacks_tower_weights

    with_tower = cached_vlm_model("gemma3")
    text_only = cached_family_model("gemma3")   # mlx-lm's save: the tower dropped
    for path, lacks in ((with_tower, False), (text_only, True)):
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "gemma3"
        assert lacks_tower_weights(path, config) is lacks
    # Not a served VLM type: never "lacking" (nothing to serve images with anyway).
    assert not lacks_tower_weights(text_only, {"model_type": "llama"})
