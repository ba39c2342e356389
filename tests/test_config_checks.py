"""Parallel settings the platform cannot run are refused when the engine's config is
made, naming the flag; pipeline parallel alone is accepted."""

from __future__ import annotations

import pytest
from vllm.engine.arg_utils import EngineArgs

from tests.tiny_models import cached_tiny_model


def _config(**kwargs):
    model = str(cached_tiny_model("llama"))
    return EngineArgs(model=model, max_model_len=256, **kwargs).create_engine_config()


@pytest.mark.parametrize("kwargs,flag", [
    (dict(tensor_parallel_size=2), "--tensor-parallel-size 2"),
    (dict(data_parallel_size=2), "--data-parallel-size 2"),
    (dict(pipeline_parallel_size=2, enable_lora=True), "--enable-lora"),
    (dict(pipeline_parallel_size=2, kv_offloading_size=1.0), "--kv-offloading-size"),
    (dict(pipeline_parallel_size=2,
          speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                              "prompt_lookup_max": 3}), "--speculative-config"),
])
def test_parallel_settings_we_cannot_run_are_refused_by_flag(kwargs, flag):
    with pytest.raises(Exception, match=flag):
        _config(**kwargs)


def test_pipeline_parallel_is_accepted():
    config = _config(pipeline_parallel_size=2)
    assert config.parallel_config.pipeline_parallel_size == 2
