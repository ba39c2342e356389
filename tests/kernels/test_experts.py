"""The expert-matmul kernel (kernels_v2/experts.metal) on the MSL harness,
launched as the host plans it (debug.experts_launch_plan, what eval_gpu
encodes), against the float64 oracle and the CPU op; a pair's result is the
same bits alone or in any batch."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import (DEFAULT_ORDERS, DTYPE_NAMES, as_float32, assert_same_bits, check_orders,
                                       find_library, nan_like, raw)
from tests.ops.linear_inputs import FLOATS, as_f64, random_float
from tests.ops.test_experts import Experts, assert_experts_close, mxfp4_dequantized, routing
from tools.msl_harness import KERNELS_DIR

E, N, K = 6, 45, 256


def run_experts(kernels, ext, ex: Experts, x: mx.array, idx: mx.array, bias: mx.array | None = None, *,
                orders: tuple[str, ...] = DEFAULT_ORDERS, guard: bool = False) -> np.ndarray:
    """out as float32 [P, N]: the planned launch under each of `orders` (which must
    agree bit for bit). The pairs are grouped by expert as the op's graph does (a
    stable argsort of idx)."""
    check_orders(orders)
    rows, k = x.shape
    pairs = idx.shape[0]
    plan = ext.debug.experts_launch_plan(DTYPE_NAMES[x.dtype], ex.bits, rows, pairs, k, ex.w.shape[1],
                                         ex.w.shape[0], group_size=ex.group_size, has_bias=bias is not None,
                                         mxfp4=ex.mode == "mxfp4")
    ids = np.array(idx, np.int32)
    order = np.argsort(ids, kind="stable").astype(np.int32)
    spare = raw(x)
    results = []
    for lane_order in orders:
        out = nan_like((pairs, ex.w.shape[1]), raw(x))
        buffers = {0: raw(x), 1: ids, 2: order, 3: raw(ex.w),
                   4: raw(ex.scales) if ex.bits else spare,
                   5: raw(ex.biases) if ex.biases is not None else spare,
                   6: raw(bias) if bias is not None else spare, 7: out, 8: plan["params"]}
        find_library(kernels, plan["kernel"]).dispatch(
            plan["kernel"], plan["grid"], plan["threads"], buffers, order=lane_order, guard=guard)
        results.append(out)
    assert_same_bits(results, orders)
    return as_float32(results[0], x.dtype)


@pytest.mark.parametrize("bits,group_size", [(0, 0), (4, 32), (4, 64), (8, 64), (8, 128)])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("tokens,shared", [(1, True), (9, True), (12, False)])
def test_matches_the_float64_oracle_and_the_cpu_op(kernels, ext, bits, group_size, dtype, tokens, shared):
    ex = Experts(bits, group_size, dtype=dtype, seed=tokens)
    idx = routing(tokens, 2, seed=tokens)
    x = random_float((tokens if shared else 2 * tokens, K), dtype=dtype, seed=tokens + 1)
    got = run_experts(kernels, ext, ex, x, idx)
    assert_experts_close(mx.array(got).astype(dtype), x, idx, ex)
    cpu = as_f64(ex(x, idx))
    np.testing.assert_allclose(got, cpu, rtol=1e-2 if dtype != mx.float32 else 1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("tokens", [1, 10])
def test_mxfp4_experts(kernels, ext, dtype, tokens):
    ex = Experts(4, mode="mxfp4", seed=tokens)
    scales = np.array(ex.scales)
    scales[0, :, 0] = 0   # 2^-127: a denormal scale decodes as MLX decodes it
    ex.scales = mx.array(scales)
    ex.w64 = mxfp4_dequantized(ex.w, ex.scales)
    idx = routing(tokens, 2, seed=tokens + 3)
    x = random_float((tokens, K), dtype=dtype, seed=tokens + 4)
    got = run_experts(kernels, ext, ex, x, idx)
    assert_experts_close(mx.array(got).astype(dtype), x, idx, ex)
    np.testing.assert_allclose(got, as_f64(ex(x, idx)), rtol=1e-2 if dtype != mx.float32 else 1e-4, atol=1e-3)


@pytest.mark.parametrize("bits", [0, 4])
def test_expert_bias_and_an_odd_k(kernels, ext, bits):
    # Float weights take any K (a partial last chunk); quantized K is whole groups.
    k = 100 if bits == 0 else 96
    ex = Experts(bits, 32, seed=3, k=k)
    bias = random_float((E, N), seed=4)
    idx = routing(5, 3, seed=5)
    x = random_float((5, k), seed=6)
    got = run_experts(kernels, ext, ex, x, idx, bias, orders=("forward", "shuffled"))
    assert_experts_close(mx.array(got), x, idx, ex, bias)


def test_a_pair_is_the_same_bits_alone_or_in_a_batch(kernels, ext):
    ex = Experts(4, 64, dtype=mx.float16, seed=7)
    x = random_float((20, K), dtype=mx.float16, seed=8)
    idx = routing(20, 2, seed=9)
    batch = run_experts(kernels, ext, ex, x, idx)
    alone = run_experts(kernels, ext, ex, x[3:4], idx[6:8])
    assert batch[6:8].tobytes() == alone.tobytes()


def test_an_index_outside_the_experts_gives_nan(kernels, ext):
    ex = Experts(8, 64, seed=10)
    x = random_float((2, K), seed=11)
    idx = mx.array([1, E, 0, -1], dtype=mx.int32)
    got = run_experts(kernels, ext, ex, x, idx, guard=True)
    assert np.isnan(got[[1, 3]]).all() and np.isfinite(got[[0, 2]]).all()


def test_the_plan(ext):
    plan = ext.debug.experts_launch_plan("bfloat16", 4, 3, 6, 256, 45, 8, group_size=64, has_bias=True)
    assert plan["kernel"] == "experts_matmul_q4_bfloat16"
    assert plan["grid"] == (12, 1, 1) and plan["threads"] == (128, 1, 1)
    assert np.frombuffer(plan["params"], np.int32).tolist() == [3, 6, 2, 256, 45, 8, 64, 1]
    assert ext.debug.experts_launch_plan("float32", 0, 17, 17, 10, 5, 2)["grid"] == (2, 3, 1)
    with pytest.raises(ValueError, match="rows dividing pairs"):
        ext.debug.experts_launch_plan("float32", 0, 3, 4, 10, 5, 2)
    with pytest.raises(ValueError, match="whole groups"):
        ext.debug.experts_launch_plan("float32", 4, 1, 2, 100, 5, 2, group_size=64)
    assert ext.debug.experts_launch_plan("float16", 4, 1, 2, 64, 5, 2, group_size=32,
                                         mxfp4=True)["kernel"] == "experts_matmul_mxfp4_float16"
    with pytest.raises(ValueError, match="mxfp4"):
        ext.debug.experts_launch_plan("float16", 4, 1, 2, 64, 5, 2, group_size=64, mxfp4=True)


def test_params_block_is_packed_four_byte_scalars(ext):
    fields, size = ext.debug.experts_params_layout()
    assert [offset for _, offset in fields] == [4 * i for i in range(len(fields))]
    assert size == 4 * len(fields)
    header = (KERNELS_DIR / "experts_params.h").read_text()
    body = header[header.index("struct ExpertParams"):header.index("};")]
    assert [name for name, _ in fields] == re.findall(r"^\s*int\s+(\w+);", body, re.MULTILINE)
