"""top_logprobs (the logprobs columns' CPU kernel) against numpy float64."""

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from vllm_metal.ops.sampling import top_logprobs


def ref_columns(x, token, k, normalize):
    """float64 scores, then (ids, vals, rank) with ties ordered by lower id."""
    s = x.astype(np.float64)
    if normalize:
        fin = s[np.isfinite(s)]
        s = s - (fin.max() + np.log(np.exp(fin - fin.max()).sum()))
    order = np.lexsort((np.arange(len(s)), -s))[:k]
    ids = [token, *order.tolist()] + [0] * max(0, k - len(s))
    vals = [s[token], *s[order].tolist()] + [-np.inf] * max(0, k - len(s))
    return np.array(ids), np.array(vals), int((s >= s[token]).sum())


def run(x, token, k, normalize):
    ids, vals, ranks = top_logprobs(mx.array(x), mx.array(token, dtype=mx.int32), k, normalize)
    assert ids.dtype == mx.int32 and vals.dtype == mx.float32 and ranks.dtype == mx.int32
    assert ids.shape == vals.shape == (x.shape[0], k + 1) and ranks.shape == (x.shape[0],)
    return np.array(ids), np.array(vals), np.array(ranks)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("rows, vocab, k", [(1, 1, 0), (1, 1, 3), (3, 7, 5), (5, 300, 20),
                                            (2, 49152, 5), (2, 100, 64), (2, 100, 65),
                                            (3, 40, 40), (1, 49152, 49152)])
def test_columns_match_float64(rows, vocab, k, normalize, isa):
    rng = np.random.default_rng(vocab * 3 + k)
    x = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    token = rng.integers(0, vocab, rows)
    with cpu_isa(isa):
        ids, vals, ranks = run(x, token, k, normalize)
    for r in range(rows):
        want_ids, want_vals, want_rank = ref_columns(x[r], token[r], k, normalize)
        np.testing.assert_array_equal(ids[r], want_ids)
        np.testing.assert_allclose(vals[r], want_vals, rtol=1e-5, atol=2e-5)
        assert ranks[r] == want_rank


def test_ties_masks_and_ranks():
    x = np.array([[1.0, 3.0, -np.inf, 3.0, 0.5, 3.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    ids, vals, ranks = run(x, np.array([3, 5]), 4, True)
    np.testing.assert_array_equal(ids[0], [3, 1, 3, 5, 0])   # tied maxima by id
    assert np.isneginf(vals[0]).sum() == 0 and ranks[0] == 3
    np.testing.assert_array_equal(ids[1], [5, 0, 1, 2, 3])
    np.testing.assert_allclose(vals[1], np.log(1 / 6), rtol=1e-6)
    assert ranks[1] == 6
    ids, vals, _ = run(x, np.array([2, 0]), 6, False)
    assert ids[0, -1] == 2 and np.isneginf(vals[0, 0]) and np.isneginf(vals[0, -1])


def test_a_token_outside_the_vocab_raises_at_evaluation():
    ids, vals, ranks = top_logprobs(mx.zeros((2, 5)), mx.array([1, 5]), 2, True)
    with pytest.raises(RuntimeError, match=r"token\[1\] = 5"):
        mx.eval(ids)


@pytest.mark.parametrize("args, match", [
    ((mx.zeros((3,)), mx.zeros((3,), dtype=mx.int32), 1, True), "x must be"),
    ((mx.zeros((2, 4)), mx.zeros((3,), dtype=mx.int32), 1, True), "token"),
    ((mx.zeros((2, 4)), mx.zeros((2,)), 1, True), "token"),
    ((mx.zeros((2, 4)), mx.zeros((2,), dtype=mx.int32), -1, True), "k must be"),
    ((mx.zeros((2, 4)), mx.zeros((2,), dtype=mx.int32), 1, 1), "normalize"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        top_logprobs(*args)
