"""fill_inputs: the next forward's input ids, with the newest step's sampled ids
(still on the device) in place of their placeholders."""

import mlx.core as mx
import numpy as np
import pytest

from tests.v1.test_input_batch import BLOCK, _apply, _cached, _new, _out
from vllm_metal.v1.input_batch import InputBatch
from vllm_metal.v1.pending_tokens import PendingTokens, covers_step


@pytest.fixture
def two_sampled():
    """Requests a (3 prompt tokens) and b (5) prefilled; their sampled ids 11 and 22
    are in flight."""
    batch = InputBatch(max_num_reqs=4, max_model_len=64, block_size=BLOCK)
    pending = PendingTokens(batch)
    out = _out(new=[_new("a", [1, 2, 3], [1]), _new("b", [4, 5, 6, 7, 8], [2])],
               sched={"a": 3, "b": 5})
    _apply(batch, out)
    batch.prepare_inputs(out)
    pending.add(mx.array([11, 22], dtype=mx.int32), ["a", "b"])
    return batch, pending


def _decode(batch, order):
    computed = {"a": 3, "b": 5}
    out = _out(cached=_cached(order, [computed[r] for r in order], [None] * len(order),
                              [1] * len(order)), sched={r: 1 for r in order})
    _apply(batch, out)
    return batch.prepare_inputs(out)


@pytest.mark.parametrize("order, whole, expected", [
    (["a", "b"], True, [11, 22]),     # the steady decode: the sampled array as is
    (["b", "a"], False, [22, 11]),    # reordered: gathered and scattered
    (["b"], False, [22]),             # a subset
])
def test_placeholders_take_the_sampled_ids(two_sampled, order, whole, expected):
    batch, pending = two_sampled
    step = _decode(batch, order)
    assert list(step.input_ids) == [-1] * len(order)  # placeholders on the host
    assert covers_step(*pending.placeholders(step), len(order), 2) is whole
    ids = pending.fill_inputs(step)
    assert ids.dtype == mx.int32
    np.testing.assert_array_equal(np.array(ids), expected)


def test_mixed_step_with_a_prefill_chunk(two_sampled):
    batch, pending = two_sampled
    out = _out(new=[_new("c", [30, 31, 32, 33], [3])],
               cached=_cached(["a"], [3], [None], [1]), sched={"a": 1, "c": 4})
    _apply(batch, out)
    step = batch.prepare_inputs(out)
    assert not covers_step(*pending.placeholders(step), 5, 2)
    np.testing.assert_array_equal(np.array(pending.fill_inputs(step)), [11, 30, 31, 32, 33])
