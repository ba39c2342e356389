"""The vectorized step inputs against a per-token Python reference."""

import numpy as np
import pytest
from vllm import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

from vllm_metal.v1.input_batch import InputBatch
from vllm_metal.v1.prompt_logprobs import PromptLogprobsTracker
from vllm_metal.v1.request_updates import apply_scheduler_output

BLOCK = 8


def _new(req_id, prompt, blocks, computed=0, *more_groups):
    """blocks: the first KV cache group's; more_groups: the others'."""
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, mm_features=[],
                          sampling_params=SamplingParams(), pooling_params=None,
                          block_ids=(blocks, *more_groups), num_computed_tokens=computed,
                          lora_request=None)


def _out(new=(), cached=None, sched=None, finished=(), preempted=None):
    cached = cached or CachedRequestData.make_empty()
    return SchedulerOutput(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
                           num_scheduled_tokens=dict(sched), total_num_scheduled_tokens=sum(sched.values()),
                           scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                           finished_req_ids=set(finished), free_encoder_mm_hashes=[],
                           preempted_req_ids=preempted)


def _cached(req_ids, computed, new_blocks, outputs, resumed=(), all_tokens=None):
    return CachedRequestData(req_ids=list(req_ids), resumed_req_ids=set(resumed),
                             new_token_ids=[[] for _ in req_ids], all_token_ids=all_tokens or {},
                             new_block_ids=list(new_blocks), num_computed_tokens=list(computed),
                             num_output_tokens=list(outputs))


def _reference(batch, out):
    """Per-token loops: what the vectorized builder must reproduce."""
    ids, pos, cu, lens, sample = [], [], [0], [], []
    slots = [[] for _ in range(batch.num_groups)]
    for req_id, n in out.num_scheduled_tokens.items():
        st = batch.requests[req_id]
        tokens = st.prompt_token_ids + st.output_token_ids
        for j in range(n):
            p = st.num_computed_tokens + j
            ids.append(tokens[p])
            pos.append(p)
            for g, blocks in enumerate(st.block_ids):
                slots[g].append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        cu.append(cu[-1] + n)
        lens.append(st.num_computed_tokens + n)
        sample.append(st.num_computed_tokens + n == len(tokens))
    return ids, pos, slots, cu, lens, sample


def _check(batch, out):
    step = batch.prepare_inputs(out)
    ids, pos, slots, cu, lens, sample = _reference(batch, out)
    np.testing.assert_array_equal(step.input_ids, ids)
    np.testing.assert_array_equal(step.positions, pos)
    np.testing.assert_array_equal(step.slot_mapping, slots)
    np.testing.assert_array_equal(step.cu_seqlens_q, cu)
    np.testing.assert_array_equal(step.seq_lens, lens)
    np.testing.assert_array_equal(step.sample_mask, sample)
    np.testing.assert_array_equal(step.logits_indices, np.asarray(cu[1:])[np.asarray(sample)] - 1)
    assert step.block_tables.shape[0] == batch.num_groups
    for i, req_id in enumerate(out.num_scheduled_tokens):
        for g, blocks in enumerate(batch.requests[req_id].block_ids):
            width = step.block_tables.shape[2]
            np.testing.assert_array_equal(step.block_tables[g, i, :min(width, len(blocks))],
                                          blocks[:width])
    return step


@pytest.fixture
def batch():
    return InputBatch(max_num_reqs=4, max_model_len=64, block_size=BLOCK)


def _apply(batch, out):
    apply_scheduler_output(batch, out, PromptLogprobsTracker(100, "raw_logprobs"))


def test_mixed_prefill_chunk_and_decode(batch):
    a = list(range(10, 30))          # 20 tokens: chunked 12 + 8
    b = list(range(50, 55))          # 5 tokens
    out = _out(new=[_new("a", a, [3, 7]), _new("b", b, [5])], sched={"a": 12, "b": 5})
    _apply(batch, out)
    step = _check(batch, out)
    assert list(step.sample_mask) == [False, True]
    batch.append_token("b", 99)
    out = _out(cached=_cached(["a", "b"], [12, 5], [([9],), None], [0, 1]), sched={"a": 8, "b": 1})
    _apply(batch, out)
    step = _check(batch, out)
    assert list(step.input_ids[-1:]) == [99]
    assert list(step.sample_mask) == [True, True]


def test_two_kv_cache_groups_get_their_own_tables_and_slots():
    # vLLM's hybrid cache: full-attention and sliding-window layers get blocks
    # separately; the sliding group's first block came back as the null block 0.
    batch = InputBatch(max_num_reqs=4, max_model_len=64, block_size=BLOCK, num_groups=2)
    a, b = list(range(10, 30)), list(range(50, 55))
    out = _out(new=[_new("a", a, [3, 7, 8], 0, [0, 4, 9]), _new("b", b, [5], 0, [6])],
               sched={"a": 20, "b": 5})
    _apply(batch, out)
    _check(batch, out)   # the packed (prefill) path
    batch.append_token("a", 98)
    batch.append_token("b", 99)
    new_blocks = [None, ([11], [12])]
    out = _out(cached=_cached(["a", "b"], [20, 5], new_blocks, [1, 1]), sched={"a": 1, "b": 1})
    _apply(batch, out)
    step = _check(batch, out)   # the one-token-per-request (decode) path
    assert step.slot_mapping.shape == (2, 2)
    assert list(step.slot_mapping[:, 0]) == [8 * BLOCK + 4, 9 * BLOCK + 4]


def test_prefix_cache_hit_starts_mid_prompt(batch):
    prompt = list(range(1, 21))
    out = _out(new=[_new("a", prompt, [4, 6, 2], computed=16)], sched={"a": 4})
    _apply(batch, out)
    step = _check(batch, out)
    assert step.positions[0] == 16


def test_preemption_resume_rebuilds_row(batch):
    prompt = list(range(1, 10))
    _apply(batch, _out(new=[_new("a", prompt, [1, 2])], sched={"a": 9}))
    batch.append_token("a", 77)
    batch.append_token("a", 78)
    _apply(batch, _out(sched={}, preempted={"a"}))
    out = _out(cached=_cached(["a"], [0], [([5, 6],)], [2], resumed=["a"],
                              all_tokens={"a": prompt + [77, 78]}), sched={"a": 11})
    _apply(batch, out)
    step = _check(batch, out)
    assert list(step.input_ids[-2:]) == [77, 78]
    assert step.slot_mapping[0, 0] == 5 * BLOCK


def test_finished_requests_free_rows(batch):
    for k in range(4):
        _apply(batch, _out(new=[_new(f"r{k}", [1, 2, 3], [k + 1])], sched={f"r{k}": 3}))
    _apply(batch, _out(sched={}, finished={"r0", "r1"}))
    out = _out(new=[_new("x", [4, 5], [9]), _new("y", [6], [10])], sched={"x": 2, "y": 1})
    _apply(batch, out)
    _check(batch, out)
    assert "r0" not in batch.requests and len(batch.row_of) == 4


def test_decode_steps_one_token_each(batch):
    """Steps of one token per request match the reference, across block boundaries, with
    the order changing and a request still one prompt token at a time."""
    a, b, c = list(range(10, 17)), list(range(40, 48)), list(range(70, 90))
    out = _out(new=[_new("a", a, [3]), _new("b", b, [5]), _new("c", c, [8, 2, 6], computed=5)],
               sched={"a": 7, "b": 8, "c": 1})
    _apply(batch, out)
    _check(batch, out)
    blocks = {"a": [3], "b": [5], "c": [8, 2, 6]}
    computed = {"a": 7, "b": 8, "c": 6}
    outputs = {"a": 0, "b": 0, "c": 0}
    for step_no in range(12):
        for r in ("a", "b"):
            batch.append_token(r, 1000 + 10 * step_no + len(r))
            outputs[r] += 1
        order = ["b", "c", "a"] if step_no % 2 else ["a", "b", "c"]
        new_blocks = []
        for r in order:
            grow = computed[r] + 1 > len(blocks[r]) * BLOCK
            extra = [20 + step_no] if grow else []
            blocks[r] += extra
            new_blocks.append((extra,) if extra else None)
        out = _out(cached=_cached(order, [computed[r] for r in order], new_blocks,
                                  [outputs[r] for r in order]), sched={r: 1 for r in order})
        _apply(batch, out)
        step = _check(batch, out)
        assert list(step.sample_mask) == [r != "c" for r in order]
        for r in order:
            computed[r] += 1


def test_a_stage_that_does_not_sample_takes_the_tokens_vllm_sends(batch):
    """Under pipeline parallel vLLM sends each running request's tokens from
    num_computed_tokens on; a stage before the last appends those it does not hold
    (the last stage's samples) and builds the step from them, as the reference does
    for a runner that sampled them itself."""
    a = list(range(10, 20))
    out = _out(new=[_new("a", a, [3, 7])], sched={"a": 10})
    apply_scheduler_output(batch, out, PromptLogprobsTracker(100, "raw_logprobs"),
                           takes_sampled=True)
    for step_no, sampled in enumerate((91, 92, 93)):
        cached = _cached(["a"], [10 + step_no], [None], [step_no + 1])
        cached.new_token_ids = [[sampled]]
        out = _out(cached=cached, sched={"a": 1})
        apply_scheduler_output(batch, out, PromptLogprobsTracker(100, "raw_logprobs"),
                               takes_sampled=True)
        step = _check(batch, out)
        assert list(step.input_ids) == [sampled]
    assert batch.requests["a"].output_token_ids == [91, 92, 93]
    # The same tokens again (a step vLLM schedules before the next sample lands) are
    # not appended twice.
    cached = _cached(["a"], [12], [None], [3])
    cached.new_token_ids = [[93]]
    apply_scheduler_output(batch, _out(cached=cached, sched={"a": 1}),
                           PromptLogprobsTracker(100, "raw_logprobs"), takes_sampled=True)
    assert batch.requests["a"].output_token_ids == [91, 92, 93]
