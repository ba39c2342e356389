"""build_sampling_batch: what it vectorizes, which fast paths it detects, what it refuses."""

import mlx.core as mx
import numpy as np
import pytest
from vllm import SamplingParams

from vllm_metal.v1.sampler import Sampler
from vllm_metal.v1.sampling_batch import (
    RequestSamplingState,
    SamplingBatchCache,
    build_sampling_batch,
    seeded_keys,
)


def state(prompt=(1, 2), output=(), **kw):
    return RequestSamplingState(SamplingParams(**kw), list(prompt), list(output))


def test_all_greedy_plain_only_without_extras():
    assert build_sampling_batch([state(temperature=0.0)] * 3, 10).all_greedy_plain
    for extra in [dict(logprobs=0), dict(repetition_penalty=1.1), dict(logit_bias={1: 1.0}),
                  dict(allowed_token_ids=[1]), dict(min_tokens=1, stop_token_ids=[2]),
                  dict(_bad_words_token_ids=[[3]]), dict(logprob_token_ids=[1])]:
        rows = [state(temperature=0.0), state(temperature=0.0, **extra)]
        batch = build_sampling_batch(rows, 10)
        assert batch.all_greedy and not batch.all_greedy_plain, extra
    assert not build_sampling_batch([state(temperature=0.0), state()], 10).all_greedy


def test_unused_features_add_nothing():
    batch = build_sampling_batch([state(), state(temperature=0.5)], 10)
    for name in ["top_k", "top_p", "min_p", "repetition_penalty", "prompt_tokens",
                 "output_tokens", "logit_bias", "allowed_tokens", "banned_tokens",
                 "stop_bans", "num_logprobs", "logprob_token_ids"]:
        assert getattr(batch, name) is None, name
    assert not batch.depends_on_output_ids


def test_per_row_arrays_hold_neutral_values_on_disabled_rows():
    greedy = SamplingParams(temperature=0.0)
    greedy.top_p, greedy.top_k, greedy.min_p = 0.5, 3, 0.2  # greedy ignores filters
    states = [RequestSamplingState(greedy, [1]), state(top_k=4), state(top_k=-1, top_p=0.7),
              state(top_k=50), state(min_p=0.1, presence_penalty=0.5, output=[3, 3])]
    b = build_sampling_batch(states, 10)
    assert b.top_k.tolist() == [10, 4, 10, 10, 10]
    assert b.top_p.tolist() == pytest.approx([1, 1, 0.7, 1, 1])
    assert b.min_p.tolist() == pytest.approx([0, 0, 0, 0, 0.1])
    assert b.temperature.tolist() == [1.0] * 5 and b.greedy.tolist() == [True] + [False] * 4
    assert b.presence_penalty.tolist() == [0, 0, 0, 0, 0.5]
    assert b.output_tokens[0].tolist() == [4, 4] and b.output_tokens[1].tolist() == [3, 3]
    assert b.prompt_tokens is None  # only the repetition penalty reads the prompt
    assert b.depends_on_output_ids


def test_min_tokens_and_bad_words_follow_the_output():
    params = dict(min_tokens=2, stop_token_ids=[5], _bad_words_token_ids=[[1, 2], [7]])
    before = build_sampling_batch([state(output=[1], **params)], 10)
    assert before.stop_bans[1].tolist() == [5]
    assert sorted(before.banned_tokens[1].tolist()) == [2, 7]
    after = build_sampling_batch([state(output=[1, 3], **params)], 10)
    assert after.stop_bans is None and after.banned_tokens[1].tolist() == [7]


def test_seeded_keys_depend_on_seed_and_step_only():
    keys = seeded_keys([7, 7, 8, -1, 2**70], [0, 1, 0, 0, 0])
    assert keys.shape == (5, 2) and keys.dtype == np.uint32
    assert len({tuple(k) for k in keys}) == 5
    np.testing.assert_array_equal(seeded_keys([7], [1])[0], keys[1])
    rows = [state(), state(seed=7, output=[1]), state(temperature=0.0, seed=7)]
    b = build_sampling_batch(rows, 10)
    assert b.seeded_rows.tolist() == [False, True, False]
    np.testing.assert_array_equal(b.seeded_keys[1], keys[1])


def test_logprob_width_is_the_largest_request():
    b = build_sampling_batch([state(logprobs=2), state(), state(logprob_token_ids=[1, 2, 3]),
                              state(logprobs=-1)], 6)
    assert b.num_logprobs == 6
    assert b.explicit_logprob_rows.tolist() == [False, False, True, False]
    assert b.logprob_token_ids[2].tolist() == [1, 2, 3, -1, -1, -1]


@pytest.mark.parametrize("kw, what", [
    (dict(logit_bias={12: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[3, 10]), "allowed_token_ids"),
    (dict(min_tokens=3, stop_token_ids=[11]), "min_tokens"),
    (dict(_bad_words_token_ids=[[-1]]), "bad_words"),
    (dict(logprob_token_ids=[40]), "logprob_token_ids"),
])
def test_token_ids_outside_vocab_are_refused(kw, what):
    with pytest.raises(ValueError, match=what):
        build_sampling_batch([state(**kw)], 10)


def test_bad_builder_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        build_sampling_batch([state()], 0)
    with pytest.raises(TypeError, match="states"):
        build_sampling_batch([SamplingParams()], 10)
    with pytest.raises(ValueError, match="output_token_ids"):
        build_sampling_batch([state(output=[12], presence_penalty=0.1)], 10)
    with pytest.raises(TypeError, match="generator_seed"):
        state(seed=1.5)


def test_sampler_refuses_mismatched_inputs():
    batch = build_sampling_batch([state(), state()], 10)
    sampler = Sampler(10)
    with pytest.raises(ValueError, match="rows"):
        sampler(mx.zeros((3, 10)), batch)
    with pytest.raises(ValueError, match="columns"):
        sampler(mx.zeros((2, 8)), batch)
    with pytest.raises(TypeError, match="mx.array"):
        sampler(np.zeros((2, 10)), batch)
    with pytest.raises(TypeError, match="floating"):
        sampler(mx.zeros((2, 10), dtype=mx.int32), batch)
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(12)(mx.zeros((2, 12)), batch)
    with pytest.raises(TypeError, match="SamplingBatch"):
        sampler(mx.zeros((2, 10)), [state()])
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(10, "processed")
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(0)


def test_empty_batch():
    res = Sampler(10)(mx.zeros((0, 10)), build_sampling_batch([], 10))
    assert res.sampled.shape == (0,) and res.logprobs is None


def test_bfloat16_logits_sample_like_float32():
    logits = mx.array(np.random.default_rng(0).normal(size=(4, 33)).astype(np.float32))
    batch = build_sampling_batch([state(temperature=0.0, logprobs=1)] * 4, 33)
    half = Sampler(33)(logits.astype(mx.bfloat16), batch)
    want = mx.argmax(logits.astype(mx.bfloat16), axis=-1)
    assert np.array_equal(np.array(half.sampled), np.array(want))
    assert half.logprobs.logprobs.dtype == mx.float32


def _same_fields(a, b):
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, other, err_msg=name)
        elif isinstance(value, tuple):
            for x, y in zip(value, other):
                np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            assert value == other, name


def test_cache_reuses_the_batch_only_for_the_same_states_in_order():
    cache = SamplingBatchCache()
    rows = [state(temperature=0.0), state(top_k=4, top_p=0.8), state(logprobs=2)]
    first = cache.get(rows, 10)
    assert cache.get(list(rows), 10) is first
    _same_fields(first, build_sampling_batch(rows, 10))
    swapped = cache.get([rows[1], rows[0], rows[2]], 10)
    assert swapped is not first
    _same_fields(swapped, build_sampling_batch([rows[1], rows[0], rows[2]], 10))
    fewer = cache.get(rows[:2], 10)
    _same_fields(fewer, build_sampling_batch(rows[:2], 10))
    # An equal but distinct state is a different request: rebuilt.
    twin = [state(temperature=0.0), rows[1]]
    assert cache.get(twin, 10) is not cache.get(rows[:2], 10)
    assert cache.get(rows[:2], 11).vocab_size == 11


@pytest.mark.parametrize("extra", [dict(seed=7), dict(repetition_penalty=1.2),
                                   dict(min_tokens=3, stop_token_ids=[2]),
                                   dict(_bad_words_token_ids=[[5, 6]])])
def test_cache_rebuilds_batches_that_read_outputs(extra):
    """Seeded keys, penalties, min_tokens and bad words change as the output grows."""
    cache = SamplingBatchCache()
    rows = [state(), state(**extra)]
    first = cache.get(rows, 10)
    rows[1].output_token_ids += [5, 2]
    second = cache.get(rows, 10)
    assert second is not first
    _same_fields(second, build_sampling_batch(rows, 10))
