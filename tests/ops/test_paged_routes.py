"""The CPU backend's paged-attention routes (Varlen, SplitKv, GqaDecode) against
the pure-MLX reference, and the dispatch diagnostics they report on Linux."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.isa import cpu_isa
from tests.ops.paged_inputs import PagedBatch, assert_close, make_batch
from vllm_metal import ops
from vllm_metal.native import get_ops
from vllm_metal.ops.reference import paged_attention_ref


@pytest.fixture
def force_route():
    ext = get_ops()
    yield ext.debug.force_paged_route
    ext.debug.force_paged_route(None)


@pytest.fixture
def diagnostics():
    ext = get_ops()
    ext.debug.set_paged_dispatch_diagnostics(True)
    yield ext.debug
    ext.debug.set_paged_dispatch_diagnostics(False)


def run(batch, **options):
    return ops.paged_attention(*batch.args(), **options)


def check(batch, dtype=mx.float32, **options):
    assert_close(run(batch, **options), paged_attention_ref(*batch.args(), **options), dtype)


DECODE_CASES = [
    # (seq_lens, num_heads, num_kv_heads, head_size, block_size)
    ([1, 3, 255, 256, 257, 513, 1100], 32, 8, 128, 16),
    ([2, 511, 512, 700], 16, 2, 256, 32),
    ([7, 300, 900], 9, 3, 64, 8),  # not a Metal GQA geometry: the CPU route still serves it
]


@pytest.mark.parametrize("route,partition", [("Varlen", 512), ("SplitKv", 256), ("SplitKv", 512),
                                             ("GqaDecode", 256), ("GqaDecode", 512), ("GqaDecode", 4096)])
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"{c[1]}x{c[2]}x{c[3]}")
def test_every_route_matches_the_reference_on_decode(force_route, route, partition, case):
    seq_lens, heads, kv_heads, head_size, block_size = case
    force_route(route, partition)
    check(make_batch(seq_lens, [1] * len(seq_lens), num_heads=heads, num_kv_heads=kv_heads,
                     head_size=head_size, block_size=block_size))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_gqa_decode_route_in_half_precision(force_route, dtype):
    force_route("GqaDecode", 256)
    check(make_batch([5, 600], [1, 1], num_heads=16, num_kv_heads=2, head_size=128, dtype=dtype), dtype)


@pytest.mark.parametrize("options", [{"sliding_window": 300}, {"softcap": 4.0},
                                     {"sinks": mx.array([float(h % 5) - 2 for h in range(24)])}],
                         ids=["window", "softcap", "sinks"])
def test_gqa_decode_route_options(force_route, options):
    force_route("GqaDecode", 256)
    batch = make_batch([40, 700, 1030], [1, 1, 1], num_heads=24, num_kv_heads=4, head_size=64)
    if "softcap" in options:
        batch.query = batch.query * 6
    check(batch, **options)


def test_split_kv_route_on_a_chunked_prefill(force_route):
    force_route("SplitKv", 256)
    check(make_batch([900, 40], [7, 40], num_heads=4, num_kv_heads=2), sliding_window=500)


SHORT_QUERY_CASES = [
    # (seq_lens, q_lens, num_heads, num_kv_heads, head_size, block_size): a few query
    # rows per sequence (speculative verification), which the decode kernel takes
    ([700, 45, 1100], [4, 2, 16], 9, 3, 64, 16),
    ([513, 300], [3, 8], 16, 2, 128, 32),
    ([260, 7], [5, 7], 8, 8, 256, 8),
]


@pytest.mark.parametrize("route,partition", [("Varlen", 512), ("SplitKv", 256)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("case", SHORT_QUERY_CASES, ids=lambda c: f"{c[2]}x{c[3]}x{c[4]}")
def test_short_queries_match_the_reference(force_route, route, partition, dtype, case):
    seq_lens, q_lens, heads, kv_heads, head_size, block_size = case
    force_route(route, partition)
    check(make_batch(seq_lens, q_lens, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                     block_size=block_size, dtype=dtype), dtype)


@pytest.mark.parametrize("options", [{"sliding_window": 300}, {"softcap": 4.0},
                                     {"sinks": mx.array([float(h % 5) - 2 for h in range(12)])}],
                         ids=["window", "softcap", "sinks"])
def test_short_query_options(options):
    batch = make_batch([40, 700, 1030], [3, 4, 16], num_heads=12, num_kv_heads=4, head_size=64)
    if "softcap" in options:
        batch.query = batch.query * 6
    check(batch, **options)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_each_row_of_a_short_query_is_what_it_gets_alone(force_route, dtype, isa):
    # The rows of a verification query share each K/V vector but not their
    # arithmetic: row r gives, bit for bit, what a one-row query at its position gives.
    force_route("Varlen", 512)
    rows = 6
    batch = make_batch([700], [rows], num_heads=9, num_kv_heads=3, head_size=64, dtype=dtype)
    with cpu_isa(isa):  # the intrinsics kernels (the portable one takes one row)
        together = np.array(run(batch))
        for r in range(rows):
            alone = PagedBatch(batch.query[r:r + 1], batch.key_cache, batch.value_cache,
                               batch.block_tables, mx.array([700 - rows + 1 + r], dtype=mx.int32),
                               mx.array([0, 1], dtype=mx.int32), batch.scale)
            assert np.array_equal(np.array(run(alone)), together[r:r + 1]), f"row {r}"


def test_forcing_gqa_decode_on_prefill_rows_is_an_error(force_route):
    force_route("GqaDecode", 512)
    with pytest.raises(RuntimeError, match="one query row per sequence"):
        mx.eval(run(make_batch([40], [3])))


def test_unknown_route_name_is_refused():
    with pytest.raises(ValueError, match="route must be"):
        get_ops().debug.force_paged_route("Fastest")


def test_diagnostics_report_gqa_decode_and_its_partition(diagnostics):
    assert diagnostics.last_paged_dispatch() is None  # nothing recorded since enabling
    mx.eval(run(make_batch([3000, 40], [1, 1], num_heads=32, num_kv_heads=8, head_size=128)))
    assert diagnostics.last_paged_dispatch() == "GqaDecode"
    # The CPU cuts its own partitions (docs/gqa-decode.md): the decision for this pool.
    decided = diagnostics.cpu_paged_dispatch([3000, 40], [1, 1], 32, 8, 128, 16, "float32",
                                             threads=get_ops().cpu_threads())
    assert diagnostics.last_gqa_partition_size() == decided["partition_size"]


def test_cpu_serves_gqa_decode_for_geometries_without_a_metal_kernel(diagnostics):
    batch = make_batch([3000, 300], [1, 1], num_heads=9, num_kv_heads=3, head_size=64)
    assert_close(run(batch), paged_attention_ref(*batch.args()), mx.float32)
    assert diagnostics.last_paged_dispatch() == "GqaDecode"


def test_diagnostics_report_split_kv_and_varlen(diagnostics):
    # A short chunk over a long context: too few (row, head) pairs for the threads.
    mx.eval(run(make_batch([3000], [3], num_heads=9, num_kv_heads=3, head_size=64)))
    assert diagnostics.last_paged_dispatch() == "SplitKv"
    assert diagnostics.last_gqa_partition_size() is None
    mx.eval(run(make_batch([400, 300], [400, 300], num_heads=9, num_kv_heads=3, head_size=64)))
    assert diagnostics.last_paged_dispatch() == "Varlen"


def test_disabling_gqa_decode_switches_the_route(diagnostics, monkeypatch):
    batch = make_batch([3000], [1], num_heads=32, num_kv_heads=8, head_size=128)
    monkeypatch.setenv("VLLM_METAL_DISABLE_GQA_DECODE", "1")
    out = run(batch)
    mx.eval(out)
    assert diagnostics.last_paged_dispatch() == "SplitKv"
    monkeypatch.setenv("VLLM_METAL_DISABLE_GQA_DECODE", "0")
    again = run(batch)
    mx.eval(again)
    assert diagnostics.last_paged_dispatch() == "GqaDecode"
    assert_close(again, out, mx.float32)  # A/B: same answer either way


def test_invalid_disable_value_is_a_clear_error(monkeypatch):
    batch = make_batch([30], [1])
    monkeypatch.setenv("VLLM_METAL_DISABLE_GQA_DECODE", "maybe")
    with pytest.raises(ValueError, match="invalid value for VLLM_METAL_DISABLE_GQA_DECODE"):
        run(batch)
    # The extension checks too, for graphs built before the variable changed.
    monkeypatch.setenv("VLLM_METAL_DISABLE_GQA_DECODE", "0")
    out = run(batch)
    monkeypatch.setenv("VLLM_METAL_DISABLE_GQA_DECODE", "maybe")
    with pytest.raises(RuntimeError, match="VLLM_METAL_DISABLE_GQA_DECODE must be a boolean"):
        mx.eval(out)


def test_nothing_is_recorded_while_diagnostics_are_off():
    ext = get_ops()
    ext.debug.set_paged_dispatch_diagnostics(False)
    mx.eval(run(make_batch([30], [1])))
    assert ext.debug.last_paged_dispatch() is None


def test_timing_hook_runs_the_decided_route_and_checks_its_arguments():
    # benchmarks/bench_decode_attention.py times paged_attention_cpu through this hook.
    ext = get_ops()
    rng = np.random.default_rng(0)
    key = rng.standard_normal((8, 16, 3, 64), dtype=np.float32)
    value = rng.standard_normal((8, 16, 3, 64), dtype=np.float32)
    tables = np.arange(8, dtype=np.int32).reshape(2, 2, 2)  # 2 "layers", 2 sequences of 2 pages
    query = rng.standard_normal((2, 9, 64), dtype=np.float32)
    seq_lens = np.array([20, 32], np.int32)
    cu = np.array([0, 1, 2], np.int32)
    times, route = ext.debug.time_cpu_paged_attention(query, key, value, tables, seq_lens, cu, 0.125, 3)
    assert len(times) == 6 and all(t > 0 for t in times)
    assert route == "GqaDecode"
    with pytest.raises(ValueError, match="block_tables must be"):
        ext.debug.time_cpu_paged_attention(query, key, value, tables[0], seq_lens, cu, 0.125)
    with pytest.raises(ValueError, match="value_cache must have key_cache's shape"):
        ext.debug.time_cpu_paged_attention(query, key, value[:4], tables, seq_lens, cu, 0.125)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        ext.debug.time_cpu_paged_attention(query, key, value, tables, seq_lens, cu, 0.125, 0)
