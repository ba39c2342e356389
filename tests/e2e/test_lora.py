"""LoRA through vllm.LLM: a request with an adapter gives mlx-lm's greedy tokens of the
checkpoint with that adapter merged (W + scale * B @ A); base requests in the same
batch give the base model's; bad adapters are refused by name and the engine serves on."""

import gc

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest

from tests import lora_adapters
from tests.e2e import mlx_reference
from tests.e2e.conftest import PROMPTS, make_llm

MAX_TOKENS = 16
RANK = 8


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    """Two PEFT adapters (attention + MLP, attention only) and an mlx-lm one, with
    their merged checkpoints."""
    root = tmp_path_factory.mktemp("lora")
    both = lora_adapters.random_updates(llama_dir, rank=RANK, seed=1)
    attn = lora_adapters.random_updates(llama_dir, lora_adapters.ATTENTION, rank=4, seed=2)
    mlp = lora_adapters.random_updates(llama_dir, lora_adapters.MLP, rank=RANK, seed=3)
    return {
        "both": (lora_adapters.write_peft(root / "both", both, RANK, alpha=16),
                 lora_adapters.merged_checkpoint(llama_dir, both, 16 / RANK, root / "both-merged")),
        "attn": (lora_adapters.write_peft(root / "attn", attn, 4, alpha=4, use_rslora=True),
                 lora_adapters.merged_checkpoint(llama_dir, attn, 4 / 2, root / "attn-merged")),
        "mlx": (lora_adapters.write_mlx_lm(root / "mlx", mlp, RANK, scale=3.0),
                lora_adapters.merged_checkpoint(llama_dir, mlp, 3.0, root / "mlx-merged")),
    }


@pytest.fixture(scope="module")
def llm(llama_dir):
    llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=RANK,
                   max_cpu_loras=3)
    yield llm
    del llm
    gc.collect()


def _generate(llm, model_dir, prompts, loras):
    ids = [mlx_reference.tokenize(model_dir, p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params,
                        lora_request=loras, use_tqdm=False)
    return ids, [list(o.outputs[0].token_ids) for o in outs]


def _request(adapters, name, int_id):
    return LoRARequest(name, int_id, str(adapters[name][0]))


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def test_the_decoder_stack_serves_with_lora(llm):
    # The tests below then run through the one-node stack with its LoRA updates.
    stack = _runner(llm).loaded.backbone.stack
    assert stack is not None and stack.lora is not None


def test_adapters_and_base_in_one_batch_match_merged_checkpoints(llm, llama_dir, adapters):
    names = ["both", None, "attn", "both", None, "attn", "both", None]
    ids_of = {"both": 1, "attn": 2}
    loras = [_request(adapters, n, ids_of[n]) if n else None for n in names]
    ids, got = _generate(llm, llama_dir, PROMPTS, loras)
    changed = 0
    for name, prompt_ids, tokens in zip(names, ids, got):
        reference = adapters[name][1] if name else llama_dir
        expected = mlx_reference.greedy_tokens(reference, prompt_ids, MAX_TOKENS)
        assert tokens == expected, f"adapter {name}"
        if name:
            changed += tokens != mlx_reference.greedy_tokens(llama_dir, prompt_ids, MAX_TOKENS)
    assert changed >= 3, "the adapters barely change the output: the test proves little"


def test_mlx_lm_adapter_format(llm, llama_dir, adapters):
    ids, got = _generate(llm, llama_dir, PROMPTS[:3], [_request(adapters, "mlx", 3)] * 3)
    for prompt_ids, tokens in zip(ids, got):
        assert tokens == mlx_reference.greedy_tokens(adapters["mlx"][1], prompt_ids, MAX_TOKENS)


def test_more_adapters_than_slots_take_turns(llm, llama_dir, adapters):
    # Three adapters over two slots: the scheduler runs at most two per step.
    names = ["both", "attn", "mlx", "mlx", "attn", "both"]
    ids_of = {"both": 1, "attn": 2, "mlx": 3}
    ids, got = _generate(llm, llama_dir, PROMPTS[:6],
                         [_request(adapters, n, ids_of[n]) for n in names])
    for name, prompt_ids, tokens in zip(names, ids, got):
        assert tokens == mlx_reference.greedy_tokens(adapters[name][1], prompt_ids, MAX_TOKENS)


@pytest.mark.parametrize("case, message", [
    ("rank", "rank 16 .*max.lora.rank 8"),
    ("module", "not a linear layer of this model"),
    ("size", "maps 64 -> "),
    ("missing", "adapter_config.json not found"),
    ("dora", "DoRA"),
])
def test_bad_adapters_are_refused_and_the_engine_serves_on(llm, llama_dir, tmp_path, case,
                                                          message):
    updates = lora_adapters.random_updates(llama_dir, ("q_proj",), rank=4)
    if case == "rank":
        updates = lora_adapters.random_updates(llama_dir, ("q_proj",), rank=16)
        path = lora_adapters.write_peft(tmp_path / case, updates, 16, alpha=16)
    elif case == "module":
        a, b = next(iter(updates.values()))
        path = lora_adapters.write_peft(tmp_path / case, {"model.layers.0.self_attn.qq_proj": (a, b)},
                                        4, alpha=4)
    elif case == "size":
        a, b = next(iter(updates.values()))
        name = next(iter(updates))
        path = lora_adapters.write_peft(tmp_path / case, {name: (a[:, :64], b)}, 4, alpha=4)
    elif case == "dora":
        path = lora_adapters.write_peft(tmp_path / case, updates, 4, alpha=4, use_dora=True)
    else:
        path = tmp_path / "nowhere"
    with pytest.raises(Exception, match=message):
        llm.llm_engine.add_lora(LoRARequest(case, 90, str(path)))
    ids, got = _generate(llm, llama_dir, PROMPTS[:1], None)
    assert got[0] == mlx_reference.greedy_tokens(llama_dir, ids[0], MAX_TOKENS)


def _mlx_lm_greedy_with_adapter(model_dir, adapter_dir, prompt_ids):
    """mlx-lm's own LoRA layers (unfused) over MODEL_DIR's weights, quantized or not."""
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(model_dir), adapter_path=str(adapter_dir))
    return [int(r.token) for r in stream_generate(model, tokenizer, prompt_ids,
                                                  max_tokens=MAX_TOKENS)]


@pytest.mark.usefixtures("exact_arithmetic")  # held to mlx-lm's fp32 arithmetic
def test_adapter_on_a_4bit_base_matches_mlx_lms_lora_layers(llama_dir, tmp_path):
    from tests.tiny_models import cached_tiny_model

    quantized = cached_tiny_model("llama", quantize_bits=4)
    updates = lora_adapters.random_updates(llama_dir, rank=RANK, seed=4)
    peft = lora_adapters.write_peft(tmp_path / "peft", updates, RANK, alpha=2 * RANK)
    reference = lora_adapters.write_mlx_lm(tmp_path / "mlx", updates, RANK, scale=2.0)
    llm = make_llm(quantized, enable_lora=True, max_loras=1, max_lora_rank=RANK)
    try:
        loras = [LoRARequest("q", 1, str(peft)), None, LoRARequest("q", 1, str(peft))]
        ids, got = _generate(llm, quantized, PROMPTS[:3], loras)
        for lora, prompt_ids, tokens in zip(loras, ids, got):
            expected = (_mlx_lm_greedy_with_adapter(quantized, reference, prompt_ids) if lora
                        else mlx_reference.greedy_tokens(quantized, prompt_ids, MAX_TOKENS))
            assert tokens == expected, f"adapter {lora}"
    finally:
        del llm
        gc.collect()


def test_bfloat16_adapters_match_the_checkpoint_merged_from_their_rounded_values(llama_dir,
                                                                                 tmp_path):
    # --lora-dtype bfloat16: the stack stores A and B rounded to bf16 and computes the
    # update in float32, so the reference merges those rounded values.
    import mlx.core as mx
    import numpy as np

    updates = lora_adapters.random_updates(llama_dir, rank=RANK, seed=7)
    peft = lora_adapters.write_peft(tmp_path / "peft", updates, RANK, alpha=2 * RANK)

    def rounded(m):
        return np.array(mx.array(m).astype(mx.bfloat16).astype(mx.float32))

    merged = lora_adapters.merged_checkpoint(
        llama_dir, {k: (rounded(a), rounded(b)) for k, (a, b) in updates.items()}, 2.0,
        tmp_path / "merged")
    llm = make_llm(llama_dir, enable_lora=True, max_loras=1, max_lora_rank=RANK,
                   lora_dtype="bfloat16")
    try:
        runner = _runner(llm)
        assert runner.lora.bank.dtype == mx.bfloat16
        assert runner.loaded.backbone.stack.lora is not None
        loras = [LoRARequest("b", 1, str(peft)), None]
        ids, got = _generate(llm, llama_dir, PROMPTS[:2], loras)
        assert got[0] == mlx_reference.greedy_tokens(merged, ids[0], MAX_TOKENS)
        assert got[1] == mlx_reference.greedy_tokens(llama_dir, ids[1], MAX_TOKENS)
    finally:
        del llm
        gc.collect()


def test_lora_target_modules_limits_the_adapters(llama_dir, tmp_path):
    updates = lora_adapters.random_updates(llama_dir, ("q_proj", "down_proj"), rank=4)
    path = lora_adapters.write_peft(tmp_path / "a", updates, 4, alpha=4)
    llm = make_llm(llama_dir, enable_lora=True, max_lora_rank=8,
                   lora_target_modules=["q_proj", "v_proj"])
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        assert {n.rsplit(".", 1)[-1] for n in runner.lora.modules} == {"q_proj", "v_proj"}
        with pytest.raises(Exception, match="down_proj, outside --lora-target-modules"):
            llm.llm_engine.add_lora(LoRARequest("a", 1, str(path)))
    finally:
        del llm
        gc.collect()


def test_an_adapter_removed_mid_request_still_serves_that_request(llm, llama_dir, adapters):
    engine = llm.llm_engine
    request = _request(adapters, "attn", 7)
    engine.add_lora(request)
    prompt_ids = mlx_reference.tokenize(llama_dir, PROMPTS[1])
    engine.add_request("mid", TokensPrompt(prompt_token_ids=prompt_ids),
                       SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                       lora_request=request)
    tokens, steps = [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = list(out.outputs[0].token_ids)
        steps += 1
        if steps == 3:
            assert engine.remove_lora(7)
            assert 7 not in engine.list_loras()
    assert tokens == mlx_reference.greedy_tokens(adapters["attn"][1], prompt_ids, MAX_TOKENS)


def test_a_request_alone_and_in_a_mixed_batch_gives_the_same_tokens(llm, llama_dir, adapters):
    ids_of = {"both": 1, "attn": 2}
    ids, alone = _generate(llm, llama_dir, PROMPTS[2:3], [_request(adapters, "attn", 2)])
    names = ["both", None, "attn", "both", None]
    _, mixed = _generate(llm, llama_dir, PROMPTS[:5],
                         [_request(adapters, n, ids_of[n]) if n else None for n in names])
    assert mixed[2] == alone[0]
    assert alone[0] == mlx_reference.greedy_tokens(adapters["attn"][1], ids[0], MAX_TOKENS)
