"""Batch invariance of the CPU paged attention: a query row's output is the same bits
whatever else the call holds, however its sequence's rows are chunked, and whichever
route or partition shares the keys among the threads (paged_pieces_cpu.h). The values
themselves are checked against the reference in test_paged_routes.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import PagedBatch, as_key_columns, make_batch
from vllm_metal import ops
from vllm_metal.native import get_ops


@pytest.fixture
def force_route():
    ext = get_ops()
    yield ext.debug.force_paged_route
    ext.debug.force_paged_route(None)


def call(batch: PagedBatch, seqs: list[int], rows: list[tuple[int, int]], options) -> np.ndarray:
    """Attention of rows [r0, r1) of each sequence in ``seqs`` (as a call holding only
    them: each sequence's context ends at its last row), float32 numpy."""
    cu = np.array(batch.cu_seqlens_q)
    lens = np.array(batch.seq_lens)
    tables = np.array(batch.block_tables)
    queries, seq_lens, q_lens = [], [], []
    for s, (r0, r1) in zip(seqs, rows):
        first = lens[s] - (cu[s + 1] - cu[s])
        queries.append(batch.query[int(cu[s]) + r0:int(cu[s]) + r1])
        seq_lens.append(first + r1)
        q_lens.append(r1 - r0)
    sub = PagedBatch(mx.concatenate(queries), batch.key_cache, batch.value_cache,
                     mx.array(tables[seqs]), mx.array(np.array(seq_lens, np.int32)),
                     mx.array(np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)),
                     batch.scale)
    return np.array(ops.paged_attention(*sub.args(), **options).astype(mx.float32))


CASES = [
    # (seq_lens, q_lens, num_heads, num_kv_heads, head_size, block_size, dtype)
    ([700, 40, 1300, 90], [5, 40, 1, 33], 9, 3, 64, 16, mx.float32),
    ([530, 300, 2100], [17, 1, 4], 16, 2, 128, 32, mx.float16),
    ([260, 77], [9, 77], 8, 8, 256, 8, mx.bfloat16),
    # Groups of 3: a row alone reads the cache directly, several rows read the
    # widened copy of each vector of keys (decode_row.inc's staging).
    ([300, 64], [6, 1], 6, 2, 64, 16, mx.float16),
    # Pages of 8 keys (half a vector on AVX-512), and one KV head for 16
    # query heads at head size 256.
    ([300, 200], [40, 1], 8, 2, 64, 8, mx.bfloat16),
    ([150, 90], [3, 30], 16, 1, 256, 16, mx.float32),
]
OPTIONS = [{}, {"sliding_window": 200}, {"softcap": 5.0},
           {"sinks": "per-head"}]


def with_sinks(options, heads):
    if options.get("sinks") == "per-head":
        return {"sinks": mx.array([float(h % 5) - 2 for h in range(heads)])}
    return options


@pytest.mark.parametrize("layout", ["rows", "key-columns"])
@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("options", OPTIONS, ids=["causal", "window", "softcap", "sinks"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}x{c[4]}-bs{c[5]}")
def test_a_row_is_the_same_in_any_call(force_route, layout, isa, options, case):
    seq_lens, q_lens, heads, kv_heads, head_size, block_size, dtype = case
    options = with_sinks(options, heads)
    batch = make_batch(seq_lens, q_lens, num_heads=heads, num_kv_heads=kv_heads,
                       head_size=head_size, block_size=block_size, dtype=dtype, seed=3)
    if layout == "key-columns":
        # The CPU backend's key pages (ops.paged_attention key_columns).
        batch = as_key_columns(batch)
        options = {**options, "key_columns": True}
    everyone = list(range(len(seq_lens)))
    with cpu_isa(isa):
        # Each row of each sequence alone: the answer every other call must give.
        alone = {(s, r): call(batch, [s], [(r, r + 1)], options)
                 for s in everyone for r in range(q_lens[s])}

        def check(seqs, rows, got, what):
            at = 0
            for s, (r0, r1) in zip(seqs, rows):
                for r in range(r0, r1):
                    assert np.array_equal(got[at], alone[(s, r)][0]), f"{what}: seq {s} row {r}"
                    at += 1

        whole = [(0, q) for q in q_lens]
        for route, partition in [(None, 0), ("Varlen", 512), ("SplitKv", 64), ("SplitKv", 256),
                                 ("SplitKv", 100)]:
            force_route(route, partition or 512)
            check(everyone, whole, call(batch, everyone, whole, options), f"{route} {partition}")
            reversed_seqs = everyone[::-1]
            check(reversed_seqs, whole[::-1], call(batch, reversed_seqs, whole[::-1], options),
                  f"{route} {partition} reversed")
        force_route(None, 512)
        # Chunked: each sequence's rows in two calls, cut in the middle.
        for s in everyone:
            cut = q_lens[s] // 2
            if cut:
                check([s], [(0, cut)], call(batch, [s], [(0, cut)], options), "first chunk")
                check([s], [(cut, q_lens[s])], call(batch, [s], [(cut, q_lens[s])], options),
                      "second chunk")


@pytest.mark.parametrize("layout", ["rows", "key-columns"])
@pytest.mark.parametrize("partition", [64, 75, 300, 4096])
def test_decode_rows_are_the_same_under_every_partition(force_route, partition, layout):
    batch = make_batch([3000, 129, 700], [1, 1, 1], num_heads=9, num_kv_heads=3, head_size=64,
                       dtype=mx.float16, seed=5)
    options = {}
    if layout == "key-columns":
        batch = as_key_columns(batch)
        options = {"key_columns": True}
    alone = [call(batch, [s], [(0, 1)], options) for s in range(3)]
    force_route("GqaDecode", partition)
    together = call(batch, [0, 1, 2], [(0, 1)] * 3, options)
    for s in range(3):
        assert np.array_equal(together[s], alone[s][0]), f"seq {s}"
