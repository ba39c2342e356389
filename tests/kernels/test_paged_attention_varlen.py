"""paged_attention_varlen (kernels_v2) on the MSL harness against the pure-MLX reference:
mixed prefill/decode batches (binary search over cu_seqlens_q), every dtype x
block size, every instantiated head size, the options, and split-KV partials
merged by paged_attention_v2_reduce."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import run_paged_attention
from tests.ops.paged_inputs import TOLERANCE, make_batch
from vllm_metal.ops.reference import paged_attention_ref

DTYPES = [mx.float16, mx.bfloat16, mx.float32]
BLOCK_SIZES = [32, 16, 8]
# A prefill, a decode, a chunk continuing a cached prefix, an empty sequence
# (no rows this step) and a chunk that spans page edges.
MIXED_SEQ_LENS = [37, 300, 60, 90, 21]
MIXED_Q_LENS = [37, 1, 9, 0, 3]


def expected(batch, **options) -> np.ndarray:
    return np.array(paged_attention_ref(*batch.args(), **options).astype(mx.float32))


def assert_matches(out, ref, dtype):
    assert np.isfinite(out).all(), "NaN in the output: a slot was not written or poison was read"
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype,block_size", list(itertools.product(DTYPES, BLOCK_SIZES)),
                         ids=lambda v: f"bs{v}" if isinstance(v, int) else str(v).split(".")[-1])
def test_mixed_batch(kernels, ext, dtype, block_size):
    batch = make_batch(MIXED_SEQ_LENS, MIXED_Q_LENS, num_heads=4, num_kv_heads=2, head_size=128,
                       block_size=block_size, dtype=dtype, seed=block_size)
    # Forward, reverse and shuffled lanes agree bit for bit: the threadgroup merge is race-free.
    out, _ = run_paged_attention(kernels, ext, batch, "Varlen", orders=("forward", "reverse", "shuffled"))
    assert_matches(out, expected(batch), dtype)


@pytest.mark.parametrize("head_size", [64, 80, 96, 112, 128, 192, 256])
def test_head_size(kernels, ext, head_size):
    batch = make_batch([50, 17], [6, 1], num_heads=4, num_kv_heads=1, head_size=head_size, block_size=16,
                       dtype=mx.float32, seed=head_size)
    out, _ = run_paged_attention(kernels, ext, batch, "Varlen", orders=("shuffled", "forward"))
    assert_matches(out, expected(batch), mx.float32)


def test_instantiated_head_sizes(ext):
    assert ext.debug.kernel_shapes()["head_sizes"] == [64, 80, 96, 112, 128, 192, 256]
    # What the Metal backend checks a model against at load.
    assert ext.metal_head_sizes() == (64, 80, 96, 112, 128, 192, 256)


@pytest.mark.parametrize("window", [1, 7, 64])
def test_sliding_window(kernels, ext, window):
    batch = make_batch([100, 40, 1], [30, 1, 1], num_heads=4, num_kv_heads=2, head_size=64, block_size=8,
                       seed=window)
    out, _ = run_paged_attention(kernels, ext, batch, "Varlen", sliding_window=window)
    assert_matches(out, expected(batch, sliding_window=window), mx.float32)


def test_softcap(kernels, ext):
    batch = make_batch([80, 20], [10, 1], num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=9)
    batch.query = batch.query * 8
    out, _ = run_paged_attention(kernels, ext, batch, "Varlen", softcap=5.0)
    assert_matches(out, expected(batch, softcap=5.0), mx.float32)


def test_sinks(kernels, ext):
    batch = make_batch([70, 25], [5, 1], num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=10)
    sinks = mx.array([-2.0, 0.0, 1.5, 4.0])
    out, _ = run_paged_attention(kernels, ext, batch, "Varlen", sinks=sinks)
    assert_matches(out, expected(batch, sinks=sinks), mx.float32)


@pytest.mark.parametrize("partition", [256, 512])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_kv_partition_boundaries(kernels, ext, partition, dtype):
    # Decode rows on both sides of each boundary, plus a 3-row chunk across one;
    # the block size rotates so each partition size meets every block size.
    seq_lens = [1, 255, 256, 257, 511, 512, 513, 600]
    q_lens = [1, 1, 1, 1, 1, 1, 1, 3]
    block_size = BLOCK_SIZES[(DTYPES.index(dtype) + partition // 256) % 3]
    batch = make_batch(seq_lens, q_lens, num_heads=4, num_kv_heads=2, head_size=96, block_size=block_size,
                       dtype=dtype, seed=partition)
    out, plan = run_paged_attention(kernels, ext, batch, "SplitKv", partition_size=partition,
                                    orders=("reverse", "shuffled"))
    assert [launch["kernel"].split("_")[2] for launch in plan["launches"]] == ["varlen", "v2"]
    assert plan["num_partitions"] == -(-600 // partition)
    assert_matches(out, expected(batch), dtype)


def test_split_kv_with_window_softcap_and_sinks(kernels, ext):
    # The window leaves early partitions empty; the reduce adds the sinks.
    batch = make_batch([900, 300], [2, 1], num_heads=4, num_kv_heads=1, head_size=64, block_size=32, seed=11)
    batch.query = batch.query * 4
    sinks = mx.array([0.5, -1.0, 2.0, 0.0])
    options = {"sliding_window": 400, "softcap": 6.0, "sinks": sinks}
    out, _ = run_paged_attention(kernels, ext, batch, "SplitKv", partition_size=256,
                                 orders=("shuffled", "forward"), **options)
    assert_matches(out, expected(batch, **options), mx.float32)


@pytest.mark.parametrize("route,partition", [("Varlen", 512), ("SplitKv", 256)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bidirectional_spans(kernels, ext, route, partition, dtype):
    # Image spans of a prefix-LM (key_ends): one begins in the cached context, one
    # crosses the 256-key partition edge, one is a whole short prompt; a decode row
    # and the rows outside spans stay causal. The window (64) covers every span.
    from tests.ops.test_bidirectional_spans import span_key_ends

    seq_lens, q_lens = [300, 40, 33, 7], [100, 40, 1, 7]
    spans = [(0, 195, 210), (0, 240, 270), (1, 3, 30), (3, 0, 6)]
    key_ends = span_key_ends(seq_lens, q_lens, spans)
    batch = make_batch(seq_lens, q_lens, num_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                       dtype=dtype, seed=13)
    for window in (None, 64):
        out, plan = run_paged_attention(kernels, ext, batch, route, partition_size=partition,
                                        orders=("shuffled", "reverse"), key_ends=key_ends,
                                        sliding_window=window)
        assert_matches(out, expected(batch, key_ends=key_ends, sliding_window=window), dtype)
    causal = expected(batch, sliding_window=64)
    assert np.abs(out - causal)[np.array(key_ends) > 0].max() > 0.05  # the spans mattered


def test_stays_in_bounds_under_guard(kernels, ext):
    batch = make_batch([33, 257], [33, 1], num_heads=2, num_kv_heads=1, head_size=80, block_size=8,
                       dtype=mx.float16, seed=12)
    out, _ = run_paged_attention(kernels, ext, batch, "SplitKv", partition_size=256, guard=True)
    assert_matches(out, expected(batch), mx.float16)


@pytest.mark.parametrize("seq_lens,q_lens", [([40, 300], [40, 1]), ([2000], [2])])
def test_default_dispatch_plan(kernels, ext, seq_lens, q_lens):
    # The route eval_gpu would take on an 8-core GPU, run as planned.
    batch = make_batch(seq_lens, q_lens, num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=13)
    decision = ext.debug.paged_dispatch(seq_lens, q_lens, 4, 2, 64, 16, "float32", compute_units=8)
    assert decision["route"] in ("Varlen", "SplitKv")
    out, plan = run_paged_attention(kernels, ext, batch, decision["route"],
                                    partition_size=decision["partition_size"] or 512)
    assert plan["num_partitions"] == decision["num_partitions"]
    assert_matches(out, expected(batch), mx.float32)
