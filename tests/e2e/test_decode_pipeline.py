"""The one-step-ahead decode pipeline: same tokens, and the device path really used."""

import gc

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm
from vllm_metal.v1 import pending_tokens


@pytest.fixture
def fills(monkeypatch):
    """Counts forwards whose input ids came (partly) from the device."""
    counter = {"device_fed": 0}
    original = pending_tokens.PendingTokens.fill_inputs

    def spy(self, step):
        if self.any:
            counter["device_fed"] += 1
        return original(self, step)

    monkeypatch.setattr(pending_tokens.PendingTokens, "fill_inputs", spy)
    return counter


@pytest.mark.parametrize("pipeline", ["1", "0"])
def test_greedy_parity_with_and_without_pipeline(llama_dir, monkeypatch, fills, pipeline):
    monkeypatch.setenv("VLLM_METAL_DECODE_PIPELINE", pipeline)
    llm = make_llm(llama_dir)
    try:
        ids = [mlx_reference.tokenize(llama_dir, p) for p in PROMPTS]
        outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids],
                            SamplingParams(temperature=0.0, max_tokens=20), use_tqdm=False)
        for prompt_ids, out in zip(ids, outs):
            assert list(out.outputs[0].token_ids) == mlx_reference.greedy_tokens(
                llama_dir, prompt_ids, 20)
    finally:
        del llm
        gc.collect()
    if pipeline == "1":
        assert fills["device_fed"] > 0, "no forward read its input ids from the device"
    else:
        assert fills["device_fed"] == 0


def test_penalized_request_beside_plain_ones(llama_dir, monkeypatch):
    """A penalty reads real ids: the runner must read pending ids back first."""
    monkeypatch.setenv("VLLM_METAL_DECODE_PIPELINE", "1")
    llm = make_llm(llama_dir)
    try:
        prompt = mlx_reference.tokenize(llama_dir, PROMPTS[1])
        plain = SamplingParams(temperature=0.0, max_tokens=24)
        penal = SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.5,
                               frequency_penalty=0.5)
        both = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * 2, [plain, penal],
                            use_tqdm=False)
        alone = llm.generate([TokensPrompt(prompt_token_ids=prompt)], [penal], use_tqdm=False)
        assert list(both[0].outputs[0].token_ids) == mlx_reference.greedy_tokens(
            llama_dir, prompt, 24)
        assert list(both[1].outputs[0].token_ids) == list(alone[0].outputs[0].token_ids)
    finally:
        del llm
        gc.collect()
