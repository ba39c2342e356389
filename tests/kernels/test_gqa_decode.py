"""paged_attention_gqa_decode (kernels_v2) on the MSL harness against the pure-MLX reference.

Every geometry x block size specialization runs over contexts that sit on the
partition boundaries (255/256/257, 511/512/513) and end in tails of 1-3 tokens
(alone, after a 4-token step, past a partition boundary), in one partition and
split into 256- and 512-key partitions (merged by paged_attention_v2_reduce),
each under two lane orders that must agree bit for bit; the dtype rotates so
every geometry and every block size meets fp16, bf16 and fp32.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import run_paged_attention
from tests.ops.paged_inputs import TOLERANCE, make_batch
from vllm_metal.ops.reference import paged_attention_ref

GEOMETRIES = [(32, 8, 128), (24, 4, 256), (16, 2, 128), (16, 2, 256)]
BLOCK_SIZES = [32, 16, 8]
DTYPES = [mx.float16, mx.bfloat16, mx.float32]
# Partition boundaries 255/256/257 and 511/512/513; tails of 1-3 tokens after no
# 4-token step (1-3), after one (5-7) and past a boundary (257, 262 = 256 + 4 + 2, 513).
BOUNDARY_CONTEXTS = [1, 2, 3, 5, 6, 7, 255, 256, 257, 262, 511, 512, 513]
ORDER_PAIRS = [("forward", "reverse"), ("reverse", "shuffled"), ("shuffled", "forward")]


def decode_batch(contexts, geometry, block_size, dtype, seed=0):
    num_heads, num_kv_heads, head_size = geometry
    return make_batch(contexts, [1] * len(contexts), num_heads=num_heads, num_kv_heads=num_kv_heads,
                      head_size=head_size, block_size=block_size, dtype=dtype, seed=seed)


def expected(batch, **options) -> np.ndarray:
    return np.array(paged_attention_ref(*batch.args(), **options).astype(mx.float32))


def assert_matches(out, ref, dtype):
    assert np.isfinite(out).all(), "NaN in the output: a slot was not written or poison was read"
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOLERANCE[dtype])


def test_instantiated_geometries_are_the_documented_twelve(ext):
    shapes = ext.debug.kernel_shapes()
    assert shapes["gqa_decode_geometries"] == GEOMETRIES
    assert len(shapes["gqa_decode_geometries"]) * len(shapes["block_sizes"]) == 12


@pytest.mark.parametrize("geometry,block_size", list(itertools.product(GEOMETRIES, BLOCK_SIZES)),
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"bs{v}")
def test_geometry_and_block_size(kernels, ext, geometry, block_size):
    index = GEOMETRIES.index(geometry) + BLOCK_SIZES.index(block_size)
    dtype = DTYPES[index % 3]
    batch = decode_batch(BOUNDARY_CONTEXTS, geometry, block_size, dtype, seed=index)
    ref = expected(batch)
    for partition, orders in zip((None, 256, 512), ORDER_PAIRS):
        out, plan = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=partition or 4096,
                                        orders=orders)
        assert plan["num_partitions"] == (1 if partition is None else -(-513 // partition))
        assert [launch["kernel"] for launch in plan["launches"]][0].startswith("paged_attention_gqa_decode_")
        assert len(plan["launches"]) == (1 if partition is None else 2)  # split: then the reduce
        assert_matches(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_context_many_partitions(kernels, ext, dtype):
    batch = decode_batch([2049, 1300], (16, 2, 128), 16, dtype, seed=3)
    out, plan = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=256,
                                    orders=("shuffled", "reverse"))
    assert plan["num_partitions"] == 9
    assert_matches(out, expected(batch), dtype)


@pytest.mark.parametrize("window", [300, 301])
@pytest.mark.parametrize("partition", [None, 256])
def test_sliding_window(kernels, ext, partition, window):
    # The window starts mid-partition (301: mid-page, off the 4-token grid too);
    # whole partitions before it are empty.
    batch = decode_batch([5, 300, 700, 1024], (32, 8, 128), 16, mx.float32, seed=4)
    out, _ = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=partition or 4096,
                                 sliding_window=window)
    assert_matches(out, expected(batch, sliding_window=window), mx.float32)


@pytest.mark.parametrize("partition", [None, 512])
def test_softcap(kernels, ext, partition):
    batch = decode_batch([40, 600], (16, 2, 256), 8, mx.float32, seed=5)
    batch.query = batch.query * 6  # large scores, so the cap bends them
    out, _ = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=partition or 4096,
                                 softcap=4.0)
    assert_matches(out, expected(batch, softcap=4.0), mx.float32)


@pytest.mark.parametrize("partition", [None, 256])
def test_sinks(kernels, ext, partition):
    batch = decode_batch([1, 90, 600], (24, 4, 256), 32, mx.bfloat16, seed=6)
    sinks = mx.array(np.linspace(-3, 5, 24, dtype=np.float32))
    out, _ = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=partition or 4096,
                                 sinks=sinks)
    assert_matches(out, expected(batch, sinks=sinks), mx.bfloat16)


def test_stays_in_bounds_under_guard(kernels, ext):
    batch = decode_batch([3, 257, 513], (16, 2, 128), 8, mx.float16, seed=7)
    out, _ = run_paged_attention(kernels, ext, batch, "GqaDecode", partition_size=256, guard=True)
    assert_matches(out, expected(batch), mx.float16)


def test_default_dispatch_plan_for_a_decode_batch(kernels, ext):
    # What eval_gpu would do for this batch on a 10-core GPU: the decision, then its plan.
    batch = decode_batch([700, 1500, 64], (32, 8, 128), 16, mx.float16, seed=8)
    decision = ext.debug.paged_dispatch([700, 1500, 64], [1, 1, 1], 32, 8, 128, 16, "float16", compute_units=10)
    assert decision["route"] == "GqaDecode" and decision["partition_size"] in (256, 512)
    out, plan = run_paged_attention(kernels, ext, batch, decision["route"],
                                    partition_size=decision["partition_size"])
    assert plan["num_partitions"] == decision["num_partitions"]
    assert_matches(out, expected(batch), mx.float16)
