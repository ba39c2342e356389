"""sample_tokens (the sampler's CPU kernel) against a numpy float64 inverse CDF."""

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from vllm_metal.ops.sampling import key_uniform, sample_tokens

MASK64 = (1 << 64) - 1


def ref_uniform(high, low):
    """splitmix64 of the 64-bit key, top 53 bits, in Python integers."""
    z = (((high << 32) | low) + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) / 2.0**53


def ref_draw(row, temperature, u):
    """(smallest index, set of acceptable indices) for one row in float64.

    Indices whose cumulative-probability boundary lies within 1e-5 of u are
    also accepted: the kernel sums float32 weights.
    """
    x = row.astype(np.float64)
    if temperature <= 0:
        return {int(np.argmax(x))}
    p = np.exp((x - x.max()) / temperature)
    cum = np.cumsum(p) / p.sum()
    want = int(np.searchsorted(cum, u, side="right"))
    near = np.nonzero(np.abs(cum - u) < 1e-5)[0]
    ok = {want} | {int(i) for i in near} | {int(i) + 1 for i in near}
    return {i for i in ok if i < len(x) and p[i] > 0}


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
        assert key_uniform(high, low) == ref_uniform(high, low)


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
    p /= p.sum()
    counts = np.bincount(got, minlength=len(x))
    assert counts[4] == 0
    keep = p > 0
    stat = ((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])).sum()
    df = keep.sum() - 1
    assert stat < df * (1 - 2 / (9 * df) + 3.72 * np.sqrt(2 / (9 * df))) ** 3


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
