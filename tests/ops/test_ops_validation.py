"""Bad arguments raise ValueError/TypeError naming the argument; bad metadata
values raise at evaluation instead of reading or writing out of bounds."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.ops.paged_inputs import make_batch
from vllm_metal import ops


@pytest.fixture
def batch():
    return make_batch([20, 9], [4, 1], num_heads=4, num_kv_heads=2, head_size=16,
                      block_size=8)


def replace(args, **changes):
    names = ["query", "key_cache", "value_cache", "block_tables", "seq_lens",
             "cu_seqlens_q", "scale"]
    values = dict(zip(names, args))
    values.update(changes)
    return [values[n] for n in names]


ATTENTION_CASES = [
    # (argument changes, exception, message fragment)
    (lambda b: dict(query=b.query[0]), ValueError, "query must be 3-D"),
    (lambda b: dict(query=b.query.astype(mx.int32)), TypeError, "query must be float16"),
    (lambda b: dict(query=b.query.tolist()), TypeError, "query must be an mx.array"),
    (lambda b: dict(key_cache=b.key_cache[0]), ValueError, "key_cache must be 4-D"),
    (lambda b: dict(value_cache=b.value_cache[:, :4]), ValueError, "value_cache shape"),
    (lambda b: dict(value_cache=b.value_cache.astype(mx.float16)), TypeError,
     "value_cache dtype"),
    (lambda b: dict(query=b.query[..., :8]), ValueError, "head_size"),
    (lambda b: dict(query=mx.concatenate([b.query, b.query[:, :1]], axis=1)), ValueError,
     "multiple of key_cache num_kv_heads"),
    (lambda b: dict(block_tables=b.block_tables.astype(mx.float32)), TypeError,
     "block_tables must be int32 or int64"),
    (lambda b: dict(block_tables=b.block_tables[0]), ValueError, "block_tables must be 2-D"),
    (lambda b: dict(seq_lens=b.seq_lens[:1]), ValueError, "seq_lens has 1 entries"),
    (lambda b: dict(seq_lens=b.seq_lens.astype(mx.uint8)), TypeError, "seq_lens must be int32"),
    (lambda b: dict(cu_seqlens_q=b.cu_seqlens_q[:2]), ValueError,
     "cu_seqlens_q must have num_seqs \\+ 1"),
    (lambda b: dict(cu_seqlens_q=b.cu_seqlens_q[None]), ValueError, "cu_seqlens_q must be 1-D"),
    (lambda b: dict(scale=0.0), ValueError, "scale must be a finite number > 0"),
    (lambda b: dict(scale=float("nan")), ValueError, "scale"),
    (lambda b: dict(scale="0.1"), TypeError, "scale must be a number"),
]


@pytest.mark.parametrize("case", range(len(ATTENTION_CASES)))
def test_paged_attention_rejects_bad_arguments(batch, case):
    change, error, message = ATTENTION_CASES[case]
    with pytest.raises(error, match=message):
        ops.paged_attention(*replace(batch.args(), **change(batch)))


@pytest.mark.parametrize("options,error,message", [
    (dict(sliding_window=0), ValueError, "sliding_window must be >= 1"),
    (dict(sliding_window=2.5), TypeError, "sliding_window must be an int"),
    (dict(sliding_window=True), TypeError, "sliding_window must be an int"),
    (dict(softcap=0.0), ValueError, "softcap must be a finite number > 0"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(sinks=mx.zeros((3,))), ValueError, "sinks must be \\[num_heads\\]"),
    (dict(sinks=mx.zeros((4,), dtype=mx.int32)), TypeError, "sinks must be a float array"),
    (dict(sinks=[0.0] * 4), TypeError, "sinks must be an mx.array"),
])
def test_paged_attention_rejects_bad_options(batch, options, error, message):
    with pytest.raises(error, match=message):
        ops.paged_attention(*batch.args(), **options)


def evaluate(batch, **changes):
    mx.eval(ops.paged_attention(*replace(batch.args(), **changes)))


def test_block_id_outside_cache_raises_at_eval(batch):
    table = batch.block_tables.tolist()
    table[0][1] = batch.key_cache.shape[0]
    with pytest.raises(RuntimeError, match="block_tables entry"):
        evaluate(batch, block_tables=mx.array(table))


def test_seq_len_shorter_than_query_rows_raises_at_eval(batch):
    with pytest.raises(RuntimeError, match="smaller than its 4 query tokens"):
        evaluate(batch, seq_lens=mx.array([3, 9]))


def test_seq_len_beyond_block_table_capacity_raises_at_eval(batch):
    capacity = batch.block_tables.shape[1] * batch.key_cache.shape[1]
    with pytest.raises(RuntimeError, match="exceeds block_tables capacity"):
        evaluate(batch, seq_lens=mx.array([capacity + 1, 9]))


def test_cu_seqlens_not_covering_query_raises_at_eval(batch):
    with pytest.raises(RuntimeError, match="cu_seqlens_q\\[-1\\] must equal"):
        evaluate(batch, cu_seqlens_q=mx.array([0, 4, 4]))
    with pytest.raises(RuntimeError, match="non-decreasing"):
        evaluate(batch, cu_seqlens_q=mx.array([0, 6, 5]))


CACHE_CASES = [
    (lambda k, v, kc, vc, s: dict(key=k[0]), ValueError, "key must be 3-D"),
    (lambda k, v, kc, vc, s: dict(value=v[:1]), ValueError, "value shape"),
    (lambda k, v, kc, vc, s: dict(key=k.astype(mx.int32)), TypeError, "key must be float16"),
    (lambda k, v, kc, vc, s: dict(key_cache=kc[0]), ValueError, "key_cache must be 4-D"),
    (lambda k, v, kc, vc, s: dict(key_cache=kc[:, :, :1]), ValueError,
     "value_cache shape"),
    (lambda k, v, kc, vc, s: dict(key=k[:, :1], value=v[:, :1]), ValueError,
     "does not match key_cache"),
    (lambda k, v, kc, vc, s: dict(slot_mapping=s[:1]), ValueError, "slot_mapping has 1 entries"),
    (lambda k, v, kc, vc, s: dict(slot_mapping=s.astype(mx.float32)), TypeError,
     "slot_mapping must be int32 or int64"),
    (lambda k, v, kc, vc, s: dict(slot_mapping=s[None]), ValueError,
     "slot_mapping must be 1-D"),
]


@pytest.mark.parametrize("case", range(len(CACHE_CASES)))
def test_reshape_and_cache_rejects_bad_arguments(case):
    args = dict(key=mx.zeros((2, 2, 8)), value=mx.zeros((2, 2, 8)),
                key_cache=mx.zeros((3, 4, 2, 8)), value_cache=mx.zeros((3, 4, 2, 8)),
                slot_mapping=mx.array([0, 1]))
    change, error, message = CACHE_CASES[case]
    args.update(change(*args.values()))
    with pytest.raises(error, match=message):
        ops.reshape_and_cache(**args)
