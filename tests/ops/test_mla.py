"""The multi-head latent attention ops (latent_cache_write, mla_attention)
against a numpy float64 oracle and the pure-MLX reference.

Cache rows no sequence owns, rows past each context and the block-table padding
are NaN: a kernel that reads them fails the comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from vllm_metal.ops.mla import latent_cache_write, mla_attention
from vllm_metal.ops.reference import latent_cache_write_ref, mla_attention_ref

RANK, ROPE = 64, 16
# A few units in the output dtype's last place for outputs of magnitude ~1.
TOLERANCE = {mx.float32: 2e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}


@dataclass
class MlaBatch:
    q_latent: mx.array      # [T, H, RANK]
    q_pe: mx.array          # [T, H, ROPE]
    cache: mx.array         # [blocks, block_size, RANK + ROPE]
    block_tables: mx.array
    seq_lens: mx.array
    cu_seqlens_q: mx.array
    scale: float

    def args(self):
        return (self.q_latent, self.q_pe, self.cache, self.block_tables, self.seq_lens,
                self.cu_seqlens_q, self.scale)


def make_batch(seq_lens, q_lens, *, heads=4, block_size=16, dtype=mx.float32,
               cache_dtype=None, seed=0, rank=RANK, rope=ROPE) -> MlaBatch:
    rng = np.random.default_rng(seed)
    need = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(need) + 2
    ids = rng.permutation(num_blocks)
    cache = np.full((num_blocks, block_size, rank + rope), np.nan, np.float32)
    tables = np.full((len(seq_lens), max(need)), int(ids[-1]), np.int32)
    at = 0
    for s, (n, b) in enumerate(zip(seq_lens, need)):
        tables[s, :b] = ids[at:at + b]
        at += b
        rows = rng.standard_normal((n, rank + rope)).astype(np.float32)
        for t in range(n):
            cache[tables[s, t // block_size], t % block_size] = rows[t]
    total = sum(q_lens)
    return MlaBatch(
        mx.array(rng.standard_normal((total, heads, rank)).astype(np.float32)).astype(dtype),
        mx.array(rng.standard_normal((total, heads, rope)).astype(np.float32)).astype(dtype),
        mx.array(cache).astype(cache_dtype or dtype), mx.array(tables),
        mx.array(np.array(seq_lens, np.int32)),
        mx.array(np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)),
        1.0 / math.sqrt(rank + rope))


def oracle(b: MlaBatch) -> np.ndarray:
    """float64 [T, H, rank]."""
    f64 = lambda a: np.array(a.astype(mx.float32), dtype=np.float64)  # noqa: E731
    ql, qp, cache = f64(b.q_latent), f64(b.q_pe), f64(b.cache)
    rank = ql.shape[-1]
    tables, lens = np.array(b.block_tables), np.array(b.seq_lens)
    cu = np.array(b.cu_seqlens_q)
    bs = cache.shape[1]
    out = np.zeros(ql.shape)
    for s, ctx in enumerate(lens):
        rows = np.stack([cache[tables[s, t // bs], t % bs] for t in range(ctx)])
        for i in range(cu[s + 1] - cu[s]):
            t = cu[s] + i
            pos = ctx - (cu[s + 1] - cu[s]) + i
            for h in range(ql.shape[1]):
                q = np.concatenate([ql[t, h], qp[t, h]])
                scores = rows[:pos + 1] @ q * b.scale
                p = np.exp(scores - scores.max())
                out[t, h] = (p / p.sum()) @ rows[:pos + 1, :rank]
    return out


def assert_close(got: mx.array, want: np.ndarray, dtype) -> None:
    got = np.array(got.astype(mx.float32), dtype=np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("seq_lens,q_lens", [
    ([1], [1]),                       # one token
    ([37], [1]),                      # decode
    ([5, 70, 33], [1, 1, 1]),         # decode batch, partial last blocks
    ([40], [40]),                     # prefill
    ([50, 9, 64], [18, 9, 1]),        # chunked prefill continuing, prefill, decode mixed
])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_matches_the_float64_oracle(seq_lens, q_lens, dtype):
    b = make_batch(seq_lens, q_lens, dtype=dtype, seed=len(seq_lens) + sum(q_lens))
    out = mla_attention(*b.args())
    assert out.shape == b.q_latent.shape and out.dtype == dtype
    assert_close(out, oracle(b), dtype)
    assert_close(mla_attention_ref(*b.args()), oracle(b), dtype)


@pytest.mark.parametrize("cache_dtype", [mx.float16, mx.bfloat16], ids=str)
def test_half_cache_under_float32_queries(cache_dtype):
    b = make_batch([45, 20], [3, 1], cache_dtype=cache_dtype, seed=3)
    assert_close(mla_attention(*b.args()), oracle(b), mx.float32)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_every_instruction_set(isa):
    # DeepSeek-V3's widths: rank 512, rope 64; 16 heads.
    b = make_batch([100, 3], [2, 3], heads=16, rank=512, rope=64, seed=4)
    with cpu_isa(isa):
        out = mla_attention(*b.args())
        mx.eval(out)
    assert_close(out, oracle(b), mx.float32)


def test_a_row_is_the_same_bits_alone_or_in_a_batch():
    b = make_batch([30, 64, 7], [1, 1, 1], heads=8, seed=5)
    batch = np.array(mla_attention(*b.args()))
    alone = np.array(mla_attention(b.q_latent[1:2], b.q_pe[1:2], b.cache, b.block_tables[1:2],
                                   b.seq_lens[1:2], mx.array([0, 1], dtype=mx.int32), b.scale))
    assert batch[1:2].tobytes() == alone.tobytes()


def test_cache_write_then_attend():
    """latent_cache_write stores [latent, k_pe] rows where mla_attention reads them."""
    rng = np.random.default_rng(6)
    cache = mx.zeros((4, 16, RANK + ROPE))
    latent = mx.array(rng.standard_normal((20, RANK)).astype(np.float32))
    k_pe = mx.array(rng.standard_normal((20, ROPE)).astype(np.float32))
    slots = mx.array(np.r_[np.arange(32, 48), np.arange(16, 20)].astype(np.int32))
    written = latent_cache_write(latent, k_pe, cache, slots)
    want = latent_cache_write_ref(latent, k_pe, mx.zeros((4, 16, RANK + ROPE)), slots)
    np.testing.assert_array_equal(np.array(written), np.array(want))
    np.testing.assert_array_equal(np.array(cache), np.array(want))   # in place
    q = mx.array(rng.standard_normal((1, 2, RANK + ROPE)).astype(np.float32))
    out = mla_attention(q[..., :RANK], q[..., RANK:], written, mx.array([[2, 1]], dtype=mx.int32),
                        mx.array([20], dtype=mx.int32), mx.array([0, 1], dtype=mx.int32), 0.1)
    rows = np.concatenate([np.array(latent), np.array(k_pe)], axis=1).astype(np.float64)
    scores = np.array(q[0], dtype=np.float64) @ rows.T * 0.1
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    want_out = (p / p.sum(axis=1, keepdims=True)) @ rows[:, :RANK]
    np.testing.assert_allclose(np.array(out[0]), want_out, atol=2e-5, rtol=2e-5)


def test_cache_write_skips_padding_and_refuses_a_slot_past_the_cache():
    cache = mx.zeros((2, 4, RANK + ROPE))
    latent, k_pe = mx.ones((2, RANK)), mx.ones((2, ROPE))
    out = latent_cache_write(latent, k_pe, cache, mx.array([-1, 3], dtype=mx.int32))
    assert np.array(out)[0, 3].sum() == RANK + ROPE and np.array(out).sum() == RANK + ROPE
    bad = latent_cache_write(latent, k_pe, mx.zeros((2, 4, RANK + ROPE)),
                             mx.array([1, 8], dtype=mx.int32))
    with pytest.raises((IndexError, ValueError, RuntimeError), match="slot 8"):
        mx.eval(bad)


def test_a_block_id_outside_the_cache_raises_at_evaluation():
    b = make_batch([20], [1], seed=7)
    tables = np.array(b.block_tables)
    tables[0, 1] = 99
    out = mla_attention(b.q_latent, b.q_pe, b.cache, mx.array(tables), b.seq_lens,
                        b.cu_seqlens_q, b.scale)
    with pytest.raises((IndexError, ValueError, RuntimeError), match="block id 99"):
        mx.eval(out)


@pytest.mark.parametrize("change,match", [
    (dict(q_pe=mx.zeros((1, 4, ROPE), dtype=mx.float16)), "q_pe must be"),
    (dict(cache=mx.zeros((3, 16, RANK))), "cache must be"),
    (dict(seq_lens=mx.zeros((2,), dtype=mx.int32)), "disagree"),
    (dict(scale=float("nan")), "scale must be finite"),
])
def test_bad_arguments_are_named(change, match):
    b = make_batch([20], [1], seed=8)
    args = dict(q_latent=b.q_latent, q_pe=b.q_pe, cache=b.cache, block_tables=b.block_tables,
                seq_lens=b.seq_lens, cu_seqlens_q=b.cu_seqlens_q, scale=b.scale)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        mla_attention(**args)
