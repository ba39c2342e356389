"""paged_attention_nax_prefill (kernels_v2: Q K^T and P V on Metal 4's matmul2d) on the
MSL harness, whose emulation of the tensor ops (tools/msl_harness/include/
msl_tensor_ops.h) gives each lane order its own cooperative-tensor layout, against the
pure-MLX reference: packed prefill batches over tiles and pages, GQA/MQA, every head
size and block size of the route, sliding window, soft-cap, sinks, bidirectional
spans, a chunk after cached context, a decode row in the batch, and the guard."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import run_paged_attention
from tests.kernels.test_paged_attention_varlen import assert_matches, expected
from tests.ops.paged_inputs import make_batch

DTYPES = [mx.float16, mx.bfloat16]
ROUTE = "NaxPrefill"
# A prompt of two tiles and a ragged third, a chunk continuing cached context,
# a short prompt (one tile, rows of one simdgroup), an empty sequence, a decode row.
SEQ_LENS = [150, 300, 20, 9, 41]
Q_LENS = [150, 70, 20, 0, 1]


@pytest.mark.parametrize("dtype,block_size", list(itertools.product(DTYPES, [32, 16, 8])),
                         ids=lambda v: f"bs{v}" if isinstance(v, int) else str(v).split(".")[-1])
def test_packed_prefill(kernels, ext, dtype, block_size):
    batch = make_batch(SEQ_LENS, Q_LENS, num_heads=4, num_kv_heads=2, head_size=64,
                       block_size=block_size, dtype=dtype, seed=block_size)
    out, plan = run_paged_attention(kernels, ext, batch, ROUTE,
                                    orders=("forward", "reverse", "shuffled"))
    assert plan["launches"][0]["kernel"].startswith("paged_attention_nax_prefill_")
    assert tuple(plan["launches"][0]["grid"]) == (4, 3 + 2 + 1 + 0 + 1, 1)
    assert_matches(out, expected(batch), dtype)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (4, 1)], ids=["mha", "mqa"])
def test_head_sizes_and_geometries(kernels, ext, head_size, heads):
    batch = make_batch([90, 40], [90, 24], num_heads=heads[0], num_kv_heads=heads[1],
                       head_size=head_size, block_size=16, dtype=mx.bfloat16, seed=head_size)
    out, _ = run_paged_attention(kernels, ext, batch, ROUTE, orders=("shuffled", "forward"))
    assert_matches(out, expected(batch), mx.bfloat16)


@pytest.mark.parametrize("window", [1, 20, 64])
def test_sliding_window(kernels, ext, window):
    batch = make_batch([130, 60], [100, 60], num_heads=4, num_kv_heads=2, head_size=64,
                       block_size=8, dtype=mx.float16, seed=window)
    out, _ = run_paged_attention(kernels, ext, batch, ROUTE, sliding_window=window)
    assert_matches(out, expected(batch, sliding_window=window), mx.float16)


def test_softcap_and_sinks(kernels, ext):
    batch = make_batch([80, 66], [80, 20], num_heads=4, num_kv_heads=2, head_size=64,
                       block_size=16, dtype=mx.float16, seed=9)
    batch.query = batch.query * 8
    sinks = mx.array([-2.0, 0.0, 1.5, 4.0])
    out, _ = run_paged_attention(kernels, ext, batch, ROUTE, softcap=5.0, sinks=sinks)
    assert_matches(out, expected(batch, softcap=5.0, sinks=sinks), mx.float16)


def test_bidirectional_spans(kernels, ext):
    from tests.ops.test_bidirectional_spans import span_key_ends

    seq_lens, q_lens = [300, 70], [100, 70]
    spans = [(0, 195, 260), (1, 3, 40)]
    key_ends = span_key_ends(seq_lens, q_lens, spans)
    batch = make_batch(seq_lens, q_lens, num_heads=4, num_kv_heads=2, head_size=64,
                       block_size=16, dtype=mx.float16, seed=13)
    out, _ = run_paged_attention(kernels, ext, batch, ROUTE, orders=("shuffled", "reverse"),
                                 key_ends=key_ends)
    assert_matches(out, expected(batch, key_ends=key_ends), mx.float16)
    assert np.abs(out - expected(batch))[np.array(key_ends) > 0].max() > 0.05


def test_stays_in_bounds_under_guard(kernels, ext):
    # 17 query rows in all: the last simdgroup's view starts 16 rows before the end.
    batch = make_batch([33, 60], [16, 1], num_heads=2, num_kv_heads=1, head_size=128,
                       block_size=8, dtype=mx.float16, seed=12)
    out, _ = run_paged_attention(kernels, ext, batch, ROUTE, guard=True)
    assert_matches(out, expected(batch), mx.float16)


def test_the_plan_refuses_what_the_kernel_lacks(ext):
    def plan(**kw):
        args = dict(seq_lens=[64], query_lens=[64], num_heads=2, num_kv_heads=1, head_size=64,
                    block_size=16, dtype="float16", route=ROUTE, scale=1.0, max_blocks_per_seq=4)
        args.update(kw)
        return ext.debug.metal_launch_plan(**args)

    launch = plan()["launches"][0]
    assert launch["kernel"] == "paged_attention_nax_prefill_float16_hd64_bs16"
    # eval_gpu takes it from the tensor-op library, every other route's from the main one.
    assert launch["library"] == "tensor_ops"
    assert [l["library"] for l in plan(route="Varlen")["launches"]] == ["main"]
    assert {l["library"] for l in plan(route="SplitKv", partition_size=32)["launches"]} == {"main"}
    for bad in (dict(head_size=80), dict(dtype="float32"), dict(kv_quant=2),
                dict(seq_lens=[8], query_lens=[8])):
        with pytest.raises(ValueError):
            plan(**bad)
