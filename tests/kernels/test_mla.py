"""The MLA kernels (kernels_v2/mla.metal) on the MSL harness, launched as the
host plans them (debug.mla_launch_plan, what eval_gpu encodes), against the
float64 oracle and the CPU op; a row is the same bits alone or in a batch."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.harness_run import (DEFAULT_ORDERS, DTYPE_NAMES, as_float32, assert_same_bits, check_orders,
                                       find_library, nan_like, raw)
from tests.ops.test_mla import MlaBatch, assert_close, make_batch, oracle
from tools.msl_harness import KERNELS_DIR
from vllm_metal.ops.mla import mla_attention


def run_attention(kernels, ext, b: MlaBatch, orders=DEFAULT_ORDERS, guard=False) -> np.ndarray:
    check_orders(orders)
    total, heads, rank = b.q_latent.shape
    cache = raw(b.cache)
    plan = ext.debug.mla_launch_plan(
        "mla_attention", DTYPE_NAMES[b.q_latent.dtype], total, num_seqs=b.seq_lens.shape[0], num_heads=heads,
        rank=rank, rope_dim=b.q_pe.shape[2], block_size=cache.shape[1], num_blocks=cache.shape[0],
        max_blocks_per_seq=b.block_tables.shape[1], scale=b.scale)
    results = []
    for order in orders:
        out = nan_like((total, heads, rank), raw(b.q_latent))
        buffers = {0: raw(b.q_latent), 1: raw(b.q_pe), 2: cache, 3: np.array(b.block_tables, np.int32),
                   4: np.array(b.seq_lens, np.int32), 5: np.array(b.cu_seqlens_q, np.int32), 6: out,
                   7: plan["params"]}
        find_library(kernels, plan["kernel"]).dispatch(plan["kernel"], plan["grid"], plan["threads"], buffers,
                                                       order=order, guard=guard)
        results.append(out)
    assert_same_bits(results, orders)
    return as_float32(results[0], b.q_latent.dtype)


@pytest.mark.parametrize("seq_lens,q_lens", [([1], [1]), ([37], [1]), ([5, 70, 33], [1, 1, 1]),
                                             ([40], [40]), ([50, 9, 64], [18, 9, 1])])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_attention_matches_the_float64_oracle_and_the_cpu_op(kernels, ext, seq_lens, q_lens, dtype):
    b = make_batch(seq_lens, q_lens, dtype=dtype, seed=len(seq_lens) + sum(q_lens))
    got = run_attention(kernels, ext, b)
    assert_close(mx.array(got), oracle(b), dtype)
    cpu = np.array(mla_attention(*b.args()).astype(mx.float32))
    np.testing.assert_allclose(got, cpu, atol=2 * {mx.float32: 2e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}[dtype])


def test_deepseek_widths(kernels, ext):
    b = make_batch([70, 3], [2, 3], heads=4, rank=512, rope=64, dtype=mx.float16, seed=3)
    assert_close(mx.array(run_attention(kernels, ext, b, orders=("forward", "shuffled"))), oracle(b), mx.float16)


def test_a_row_is_the_same_bits_alone_or_in_a_batch(kernels, ext):
    b = make_batch([30, 64, 7], [1, 1, 1], heads=4, dtype=mx.float16, seed=5)
    batch = run_attention(kernels, ext, b)
    alone = MlaBatch(b.q_latent[1:2], b.q_pe[1:2], b.cache, b.block_tables[1:2], b.seq_lens[1:2],
                     mx.array([0, 1], dtype=mx.int32), b.scale)
    assert batch[1:2].tobytes() == run_attention(kernels, ext, alone).tobytes()


def test_a_block_outside_the_cache_gives_nan_rows(kernels, ext):
    b = make_batch([20, 5], [1, 1], seed=6)
    tables = np.array(b.block_tables)
    tables[0, 1] = 99
    bad = MlaBatch(b.q_latent, b.q_pe, b.cache, mx.array(tables), b.seq_lens, b.cu_seqlens_q, b.scale)
    got = run_attention(kernels, ext, bad, guard=True)
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_cache_write(kernels, ext, dtype):
    rng = np.random.default_rng(7)
    rank, rope, tokens = 64, 16, 5
    latent = mx.array(rng.standard_normal((tokens, rank)).astype(np.float32)).astype(dtype)
    k_pe = mx.array(rng.standard_normal((tokens, rope)).astype(np.float32)).astype(dtype)
    slots = np.array([3, -1, 17, 40, 0], np.int32)   # 40 is past the 2 x 16 slots: skipped
    plan = ext.debug.mla_launch_plan("latent_cache_write", DTYPE_NAMES[dtype], tokens, rank=rank, rope_dim=rope,
                                     block_size=16, num_blocks=2)
    results = []
    for order in DEFAULT_ORDERS:
        cache = nan_like((2, 16, rank + rope), raw(latent))
        find_library(kernels, plan["kernel"]).dispatch(
            plan["kernel"], plan["grid"], plan["threads"],
            {0: raw(latent), 1: raw(k_pe), 2: cache, 3: slots, 7: plan["params"]}, order=order)
        results.append(cache)
    assert_same_bits(results, DEFAULT_ORDERS)
    got = as_float32(results[0], dtype).reshape(32, rank + rope)
    want = np.concatenate([np.array(latent.astype(mx.float32)), np.array(k_pe.astype(mx.float32))], axis=1)
    for t, slot in enumerate(slots):
        if 0 <= slot < 32:
            np.testing.assert_array_equal(got[slot], want[t])
    written = {int(s) for s in slots if 0 <= s < 32}
    assert np.isnan(got[[s for s in range(32) if s not in written]]).all()


def test_the_plans(ext):
    plan = ext.debug.mla_launch_plan("mla_attention", "bfloat16", 3, num_seqs=2, num_heads=16, rank=512,
                                     rope_dim=64, block_size=16, num_blocks=9, max_blocks_per_seq=4, scale=0.5)
    assert plan["kernel"] == "mla_attention_bfloat16"
    assert plan["grid"] == (16, 3, 1) and plan["threads"] == (32, 1, 1)
    ints = np.frombuffer(plan["params"][:32], np.int32).tolist()
    assert ints == [3, 2, 16, 512, 64, 16, 9, 4]
    assert np.frombuffer(plan["params"][32:], np.float32).tolist() == [0.5]
    write = ext.debug.mla_launch_plan("latent_cache_write", "float16", 7, rank=512, rope_dim=64, block_size=16,
                                      num_blocks=9)
    assert write["kernel"] == "latent_cache_write_float16" and write["grid"] == (5, 7, 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        ext.debug.mla_launch_plan("mla_attention", "float16", 1, num_seqs=1, num_heads=1, rank=48, rope_dim=16,
                                  block_size=16, num_blocks=1, max_blocks_per_seq=1)


def test_params_block_is_packed_four_byte_scalars(ext):
    fields, size = ext.debug.mla_params_layout()
    assert [offset for _, offset in fields] == [4 * i for i in range(len(fields))]
    assert size == 4 * len(fields)
    header = (KERNELS_DIR / "mla_params.h").read_text()
    body = header[header.index("struct MlaParams"):header.index("};")]
    assert [name for name, _ in fields] == re.findall(r"^\s*(?:int|float)\s+(\w+);", body, re.MULTILINE)
