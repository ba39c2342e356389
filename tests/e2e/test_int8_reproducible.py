"""With int8 activations (VLLM_METAL_CPU_INT8_ACTIVATIONS=1), a greedy request gives
the same tokens alone, inside a batch, in another batch order, and streamed through
``vllm serve`` while other requests come and go: every CPU kernel a row meets computes
it the same way whatever shares its step (csrc/cpu/linear/linear_q8.h,
csrc/cpu/attention/paged_pieces_cpu.h)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.e2e.conftest import PROMPTS, make_llm

INT8 = {"VLLM_METAL_CPU_INT8_ACTIVATIONS": "1", "VLLM_METAL_CPU_KV_CACHE_DTYPE": "float16"}
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def q4_dir():
    from tests.tiny_models import cached_tiny_model

    return cached_tiny_model("llama", quantize_bits=4, group_size=32)


def _model(kind: str):
    if kind == "llama":
        from tests.tiny_models import cached_tiny_model

        return cached_tiny_model("llama", quantize_bits=4, group_size=32)
    from tests.family_models import cached_family_model

    return cached_family_model(kind, quantize_bits=4, group_size=32)


def _tiled_layers(llm) -> int:
    from vllm_metal.cpu.fast_experts import FastQuantizedSwitchLinear
    from vllm_metal.cpu.fast_linears import FastQuantizedEmbedding, FastQuantizedLinear

    kinds = (FastQuantizedLinear, FastQuantizedEmbedding, FastQuantizedSwitchLinear)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.loaded.model
    return sum(isinstance(m, kinds) and m.tiled for _, m in model.named_modules())


# The dense model through the decoder stack; a mixture of experts (a shared expert
# beside four routed ones) through the stack and through the modules.
@pytest.mark.parametrize("kind,stack", [("llama", "1"), ("qwen2_moe", "1"), ("qwen2_moe", "0")])
def test_greedy_tokens_do_not_depend_on_the_batch(kind, stack, monkeypatch):
    from vllm import SamplingParams

    for name, value in {**INT8, "VLLM_METAL_CPU_DECODER_STACK": stack}.items():
        monkeypatch.setenv(name, value)
    llm = make_llm(_model(kind), enable_prefix_caching=False)
    assert _tiled_layers(llm) > 0  # the int8 path is what runs
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def tokens(prompts):
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params,
                                                                   use_tqdm=False)]

    alone = [tokens([p])[0] for p in PROMPTS]
    assert tokens(PROMPTS) == alone
    assert tokens(PROMPTS[::-1])[::-1] == alone
    # Chunked: one long prompt's prefill shares steps with the others' decodes.
    staggered = tokens([PROMPTS[5] * 6, *PROMPTS])
    assert staggered[1:] == alone


def test_streamed_and_concurrent_requests_match_lone_ones(q4_dir):
    from tests.e2e.server import VllmServer

    srv = VllmServer(str(q4_dir), "--max-model-len", "512", "--max-num-seqs", "8",
                     "--gpu-memory-utilization", "0.3", "--served-model-name", "tiny",
                     env={**os.environ, **INT8})
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused")
        kwargs = dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0,
                      extra_body={"ignore_eos": True})

        def whole(prompt):
            return client.completions.create(prompt=prompt, **kwargs).choices[0].text

        def streamed(prompt):
            chunks = client.completions.create(prompt=prompt, stream=True, **kwargs)
            return "".join(c.choices[0].text for c in chunks)

        alone = [whole(p) for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(streamed, PROMPTS))
            mixed = list(pool.map(lambda i: (whole if i % 2 else streamed)(PROMPTS[i]),
                                  range(len(PROMPTS))))
        assert together == alone
        assert mixed == alone
    finally:
        srv.stop()
