"""sample_tokens (the sampler's CPU kernel) against a numpy float64 inverse CDF."""

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from vllm_metal.native import get_ops
from vllm_metal.ops.sampling import sample_tokens

MASK64 = (1 << 64) - 1


def ref_uniform(high, low):
    """splitmix64 of the 64-bit key, top 53 bits, in Python integers."""
    z = (((high << 32) | low) + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) / 2.0**53


def ref_kept(x, temperature, min_p=0.0, top_k=0, top_p=1.0):
    """float64 weights exp((x - max) / T) and the tokens min_p, top-k, top-p keep."""
    x = x.astype(np.float64)
    w = np.exp((x - x.max()) / temperature)
    keep = w > 0
    if min_p > 0:
        keep &= w >= min_p
    if 0 < top_k < len(x) and keep.sum() > top_k:
        keep &= w >= np.sort(w[keep])[::-1][top_k - 1]
    if top_p < 1:
        asc = np.sort(w[keep])
        cum = np.cumsum(asc)
        keep &= w >= asc[np.argmax(cum > cum[-1] * (1 - top_p))]
    return w, keep


def ref_draw(row, temperature, u, **filters):
    """The set of acceptable draws for one row, in float64: the argmax for T <= 0,
    else the smallest index whose cumulative filtered probability exceeds u.

    Indices whose cumulative-probability boundary lies within 1e-5 of u are
    also accepted: the kernel sums float32 weights.
    """
    if temperature <= 0:
        return {int(np.argmax(row.astype(np.float64)))}
    w, keep = ref_kept(row, temperature, **filters)
    p = np.where(keep, w, 0.0)
    cum = np.cumsum(p) / p.sum()
    want = int(np.searchsorted(cum, u, side="right"))
    near = np.nonzero(np.abs(cum - u) < 1e-5)[0]
    ok = {want} | {int(i) for i in near} | {int(i) + 1 for i in near}
    return {i for i in ok if i < len(row) and keep[i]}


def assert_fits(counts, p):
    """Counts of n draws fit probabilities p (chi-square, upper tail ~1e-4)."""
    assert counts[p == 0].sum() == 0, "drew a token of probability 0"
    k = p > 0
    n = counts.sum()
    stat = ((counts[k] - n * p[k]) ** 2 / (n * p[k])).sum()
    df = k.sum() - 1
    assert stat < df * (1 - 2 / (9 * df) + 3.72 * np.sqrt(2 / (9 * df))) ** 3


def keys_for(rows, seed):
    return np.random.default_rng(seed).integers(0, 2**32, size=(rows, 2), dtype=np.uint32)


def draw(logits, temperature, keys, dtype=mx.float32):
    out = sample_tokens(mx.array(logits).astype(dtype), mx.array(temperature, dtype=mx.float32),
                        mx.array(keys))
    assert out.dtype == mx.int32
    return np.array(out)


def test_key_uniform_is_splitmix64():
    rng = np.random.default_rng(0)
    for high, low in [(0, 0), (0, 1), (2**32 - 1, 2**32 - 1)] + [
            tuple(int(v) for v in rng.integers(0, 2**32, 2)) for _ in range(50)]:
        assert get_ops().debug.key_uniform(high, low) == ref_uniform(high, low)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, 7), (3, 511), (2, 512), (5, 513),
                                         (17, 1537), (2, 49152)])
def test_draws_match_the_float64_inverse_cdf(isa, rows, vocab):
    rng = np.random.default_rng(rows * 7 + vocab)
    logits = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    logits[:, rng.random(vocab) < 0.2] = -np.inf   # masked tokens
    logits[:, 0] = rng.normal()                    # every row keeps one finite logit
    temperature = rng.choice([0.0, 0.3, 1.0, 2.5], rows).astype(np.float32)
    keys = keys_for(rows, vocab)
    with cpu_isa(isa):
        got = draw(logits, temperature, keys)
    for r in range(rows):
        ok = ref_draw(logits[r], temperature[r], ref_uniform(*map(int, keys[r])))
        assert got[r] in ok, (r, got[r], ok)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_logits_draw_from_their_float32_values(dtype):
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, (4, 300)).astype(np.float32)
    keys = keys_for(4, 5)
    temperature = np.full(4, 0.8, np.float32)
    rounded = np.array(mx.array(logits).astype(dtype).astype(mx.float32))
    got = draw(logits, temperature, keys, dtype)
    for r in range(4):
        assert got[r] in ref_draw(rounded[r], 0.8, ref_uniform(*map(int, keys[r])))


def test_draws_follow_softmax():
    """Many keys on one row: the counts fit softmax(x / T) (chi-square, p ~ 1e-4)."""
    x = np.array([1.0, 0.0, -1.0, 2.0, -np.inf, 0.5, -3.0, 1.5], np.float32)
    n = 20000
    got = draw(np.tile(x, (n, 1)), np.full(n, 0.7, np.float32), keys_for(n, 11))
    p = np.exp((x.astype(np.float64) - x.max()) / 0.7)
    assert_fits(np.bincount(got, minlength=len(x)), p / p.sum())


def test_argmax_rows_take_the_first_maximum():
    logits = np.array([[0.0, 3.0, 1.0, 3.0], [-np.inf, -1.0, -1.0, -np.inf]], np.float32)
    got = draw(logits, np.zeros(2, np.float32), np.zeros((2, 2), np.uint32))
    np.testing.assert_array_equal(got, [1, 1])


def test_degenerate_rows():
    inf = np.inf
    logits = np.array([
        [-inf, -inf, -inf, -inf],        # nothing to draw: 0
        [0.0, inf, 1.0, inf],            # +inf wins, the first one
        [np.nan, 1.0, np.nan, -inf],     # NaN never drawn over a finite logit
        [1e30, -1e30, 1e30, 0.0],        # huge logits stay finite in the weights
        [5.0, 4.0, 3.0, 2.0],            # T = 1e-30: argmax
    ], np.float32)
    temperature = np.array([1.0, 1.0, 1.0, 1.0, 1e-30], np.float32)
    got = draw(logits, temperature, keys_for(5, 2))
    assert got[0] == 0 and got[1] == 1 and got[4] == 0
    assert got[3] in (0, 2)
    assert got[2] == 1


def test_strided_logits_are_read_by_row():
    rng = np.random.default_rng(8)
    wide = mx.array(rng.normal(0, 2, (3, 80)).astype(np.float32))
    keys = keys_for(3, 8)
    temperature = np.ones(3, np.float32)
    got = np.array(sample_tokens(wide[:, :50], mx.array(temperature), mx.array(keys)))
    sliced = np.array(wide[:, :50])
    for r in range(3):
        assert got[r] in ref_draw(sliced[r], 1.0, ref_uniform(*map(int, keys[r])))


@pytest.mark.parametrize("args, match", [
    ((mx.zeros((3,)), mx.zeros((3,)), mx.zeros((3, 2), dtype=mx.uint32)), "logits must be"),
    ((mx.zeros((2, 4), dtype=mx.int32), mx.zeros((2,)), mx.zeros((2, 2), dtype=mx.uint32)),
     "logits must be"),
    ((mx.zeros((2, 4)), mx.zeros((3,)), mx.zeros((2, 2), dtype=mx.uint32)), "temperature"),
    ((mx.zeros((2, 4)), mx.zeros((2,)), mx.zeros((2, 2), dtype=mx.int32)), "keys"),
    ((mx.zeros((2, 4)), mx.zeros((2,)), mx.zeros((2, 3), dtype=mx.uint32)), "keys"),
    ((np.zeros((2, 4)), mx.zeros((2,)), mx.zeros((2, 2), dtype=mx.uint32)), "logits"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        sample_tokens(*args)


# ---------------------------------------------------------------- filters

FILTERS = [
    dict(min_p=0.1), dict(top_k=1), dict(top_k=5), dict(top_k=200), dict(top_p=0.5),
    dict(top_p=0.95), dict(top_p=1e-6), dict(min_p=0.02, top_k=40, top_p=0.9),
    dict(top_k=3, top_p=0.99),
]


@pytest.mark.parametrize("isa", ["generic", "avx512"])
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("vocab, scale", [(97, 2.0), (4099, 0.3), (49152, 3.0)])
def test_filtered_draws_match_the_float64_reference(isa, filters, vocab, scale):
    rows = 6
    rng = np.random.default_rng(vocab)
    logits = rng.normal(0, scale, (rows, vocab)).astype(np.float32)
    logits[1, rng.random(vocab) < 0.5] = -np.inf
    logits[1, 3] = 0.0
    temperature = np.array([1.0, 0.7, 1.5, 1.0, 0.25, 1.0], np.float32)
    keys = keys_for(rows, vocab + 1)
    per_row = {k: np.full(rows, v, np.int32 if k == "top_k" else np.float32)
               for k, v in filters.items()}
    with cpu_isa(isa):
        got = np.array(sample_tokens(mx.array(logits), mx.array(temperature), mx.array(keys),
                                     **{k: mx.array(v) for k, v in per_row.items()}))
    for r in range(rows):
        ok = ref_draw(logits[r], temperature[r], ref_uniform(*map(int, keys[r])),
                               **filters)
        assert got[r] in ok, (r, got[r], ok)


def test_filters_follow_their_distribution():
    """Many keys, one row, every filter on: counts fit the filtered softmax."""
    x = np.array([3.0, 2.9, 2.0, 1.0, 1.0, 0.0, -1.0, -4.0, 2.5, 0.5], np.float32)
    n, temperature, filters = 20000, 0.9, dict(min_p=0.02, top_k=6, top_p=0.9)
    got = np.array(sample_tokens(
        mx.array(np.tile(x, (n, 1))), mx.full((n,), temperature), mx.array(keys_for(n, 4)),
        min_p=mx.full((n,), filters["min_p"]), top_k=mx.full((n,), filters["top_k"], mx.int32),
        top_p=mx.full((n,), filters["top_p"])))
    w, keep = ref_kept(x, temperature, **filters)
    p = np.where(keep, w, 0.0)
    assert_fits(np.bincount(got, minlength=len(x)), p / p.sum())


def test_filters_keep_ties_and_spare_greedy_rows():
    logits = np.array([[1.0, 2.0, 2.0, 2.0, 0.0], [1.0, 2.0, 2.0, 2.0, 0.0]], np.float32)
    got = set()
    for seed in range(64):
        out = np.array(sample_tokens(
            mx.array(logits), mx.array([1.0, 0.0]), mx.array(keys_for(2, seed)),
            top_k=mx.array([1, 1], mx.int32)))
        assert out[1] == 1   # greedy row: argmax, filters not applied
        got.add(int(out[0]))
    assert got == {1, 2, 3}   # top_k=1 keeps all three tied maxima


def test_filter_arguments_are_checked():
    args = (mx.zeros((2, 4)), mx.ones((2,)), mx.zeros((2, 2), dtype=mx.uint32))
    with pytest.raises(ValueError, match="top_k"):
        sample_tokens(*args, top_k=mx.ones((3,), dtype=mx.int32))
    with pytest.raises(ValueError, match="top_p"):
        sample_tokens(*args, top_p=mx.ones((2,), dtype=mx.int32))
    with pytest.raises(TypeError, match="min_p"):
        sample_tokens(*args, min_p=np.ones(2))


# ---------------------------------------------------------------- grammar bitmask

def random_bitmask(rng, rows, vocab, density, extra_words=0):
    """uint32 [rows, ceil(vocab / 32) + extra_words] and the bool [rows, vocab] it admits."""
    allowed = rng.random((rows, vocab)) < density
    allowed[:, rng.integers(0, vocab)] = True          # every row admits something
    words = -(-vocab // 32) + extra_words
    bits = np.zeros((rows, words * 32), dtype=bool)
    bits[:, :vocab] = allowed
    bits[:, vocab:] = rng.random((rows, words * 32 - vocab)) < 0.5   # past V: ignored
    packed = (bits.reshape(rows, words, 32) * (1 << np.arange(32, dtype=np.uint64))).sum(-1)
    return packed.astype(np.uint32), allowed


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("vocab, density", [(7, 0.5), (513, 0.01), (4099, 0.3), (49152, 0.002)])
def test_the_bitmask_draws_as_minus_inf_logits_would(isa, vocab, density):
    rows = 6
    rng = np.random.default_rng(vocab)
    logits = rng.normal(0, 2, (rows, vocab)).astype(np.float32)
    bitmask, allowed = random_bitmask(rng, rows, vocab, density, extra_words=1)
    masked = np.where(allowed, logits, -np.inf)
    temperature = np.array([0.0, 0.7, 1.0, 0.0, 2.0, 1.0], np.float32)
    keys = keys_for(rows, vocab + 3)
    top_k = np.array([0, 0, 5, 0, 0, 2], np.int32)
    with cpu_isa(isa):
        got = np.array(sample_tokens(mx.array(logits), mx.array(temperature), mx.array(keys),
                                     top_k=mx.array(top_k), allowed=mx.array(bitmask)))
    for r in range(rows):
        assert allowed[r, got[r]], (r, got[r])
        ok = ref_draw(masked[r], temperature[r], ref_uniform(*map(int, keys[r])),
                      top_k=int(top_k[r]))
        assert got[r] in ok, (r, got[r], ok)


def test_a_row_the_bitmask_empties_gives_0():
    logits = mx.array(np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], np.float32))
    bitmask = mx.array(np.array([[0], [0b010]], np.uint32))
    for t in (0.0, 1.0):
        got = sample_tokens(logits, mx.full((2,), t), mx.zeros((2, 2), dtype=mx.uint32),
                            allowed=bitmask)
        np.testing.assert_array_equal(np.array(got), [0, 1])


@pytest.mark.parametrize("bad", [
    mx.zeros((2, 1), dtype=mx.uint32),          # too few words for V = 40
    mx.zeros((2, 2), dtype=mx.int32),
    mx.zeros((3, 2), dtype=mx.uint32),
])
def test_a_bad_bitmask_is_refused(bad):
    with pytest.raises(ValueError, match="allowed"):
        sample_tokens(mx.zeros((2, 40)), mx.zeros((2,)), mx.zeros((2, 2), dtype=mx.uint32),
                      allowed=bad)
