"""--gpu-memory-utilization too small for one request fails at startup with the numbers."""

import pytest

from tests.e2e.conftest import make_llm


def test_startup_names_the_flag_when_one_request_does_not_fit(llama_dir):
    with pytest.raises(Exception) as info:
        make_llm(llama_dir, max_model_len=4096, gpu_memory_utilization=0.00002)
    text = str(info.value) + "".join(str(a) for a in getattr(info.value, "args", ()))
    chain = info.value
    while chain is not None and "--gpu-memory-utilization" not in text:
        chain = chain.__cause__ or chain.__context__
        text += str(chain)
    assert "--gpu-memory-utilization" in text and "--max-model-len" in text
