"""The CPU backend's paged-attention routes (Varlen, SplitKv, GqaDecode) against
the pure-MLX reference, and the dispatch diagnostics they report on Linux."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.ops.paged_inputs import assert_close, make_batch
from vllm_metal import ops
from vllm_metal.metal import get_ops
from vllm_metal.ops.reference import paged_attention_ref


@pytest.fixture
def force_route():
    ext = get_ops()
    yield ext._force_paged_route
    ext._force_paged_route(None)


@pytest.fixture
def diagnostics():
    ext = get_ops()
    ext._set_paged_dispatch_diagnostics(True)
    yield ext
    ext._set_paged_dispatch_diagnostics(False)


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


def test_forcing_gqa_decode_on_prefill_rows_is_an_error(force_route):
    force_route("GqaDecode", 512)
    with pytest.raises(RuntimeError, match="one query row per sequence"):
        mx.eval(run(make_batch([40], [3])))


def test_unknown_route_name_is_refused():
    with pytest.raises(ValueError, match="route must be"):
        get_ops()._force_paged_route("Fastest")


def test_diagnostics_report_gqa_decode_and_its_partition(diagnostics):
    assert diagnostics.last_paged_dispatch() is None  # nothing recorded since enabling
    mx.eval(run(make_batch([3000, 40], [1, 1], num_heads=32, num_kv_heads=8, head_size=128)))
    assert diagnostics.last_paged_dispatch() == "GqaDecode"
    assert diagnostics.last_gqa_partition_size() in (256, 512)


def test_diagnostics_report_split_kv_and_varlen(diagnostics):
    mx.eval(run(make_batch([3000], [1], num_heads=9, num_kv_heads=3, head_size=64)))
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
    ext._set_paged_dispatch_diagnostics(False)
    mx.eval(run(make_batch([30], [1])))
    assert ext.last_paged_dispatch() is None
