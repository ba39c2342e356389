"""The dispatch decision table (csrc/dispatch/paged_dispatch.cpp), one rule per test.

The decision is a pure function of the shapes, dtypes, lengths, compute units
and environment, exposed as get_ops()._paged_dispatch; docs/kernels.md lists
the same rules.
"""

from __future__ import annotations

import random
import sys

import pytest

from vllm_metal.metal import get_ops

LLAMA = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128}  # a GQA decode geometry
SMOLLM = {"num_heads": 9, "num_kv_heads": 3, "head_size": 64}   # no GQA decode kernel
BUDGET_PER_CORE = 33


def decide(seq_lens, query_lens=None, *, shape=LLAMA, block_size=16, dtype="float16", query_dtype=None,
           cores=10, disabled=False):
    return get_ops()._paged_dispatch(
        seq_lens, query_lens if query_lens is not None else [1] * len(seq_lens), shape["num_heads"],
        shape["num_kv_heads"], shape["head_size"], block_size, dtype, query_dtype=query_dtype,
        compute_units=cores, gqa_decode_disabled=disabled)


def test_decode_of_a_gqa_geometry_takes_gqa_decode():
    d = decide([1000, 3000])
    assert d["route"] == "GqaDecode"
    assert d["num_partitions"] == -(-3000 // d["partition_size"])


@pytest.mark.parametrize("geometry", [(32, 8, 128), (24, 4, 256), (16, 2, 128), (16, 2, 256)])
@pytest.mark.parametrize("block_size", [32, 16, 8])
def test_every_geometry_and_block_size_is_admitted(geometry, block_size):
    shape = dict(zip(("num_heads", "num_kv_heads", "head_size"), geometry))
    assert decide([700], shape=shape, block_size=block_size)["route"] == "GqaDecode"


def test_512_partitions_when_complete_ones_fill_the_budget():
    # One core: budget 33 simdgroups. 1024 keys = 2 complete 512-partitions x 32 heads = 64 >= 33.
    d = decide([1024], cores=1)
    assert (d["route"], d["partition_size"], d["num_partitions"]) == ("GqaDecode", 512, 2)


def test_ragged_tail_is_not_work_so_256_is_chosen():
    # 1023 keys: one complete 512-partition (32 simdgroups < 33); 256-partitions give 3 complete.
    d = decide([1023], cores=1)
    assert (d["partition_size"], d["num_partitions"]) == (256, 4)


def test_budget_is_33_simdgroups_per_core():
    # 16 sequences x 2 complete 512-partitions x 32 heads = 1024 simdgroups.
    lens = [1024] * 16
    assert decide(lens, cores=1024 // BUDGET_PER_CORE)["partition_size"] == 512  # budget 1023
    assert decide(lens, cores=1024 // BUDGET_PER_CORE + 1)["partition_size"] == 256  # budget 1056


def test_short_contexts_use_one_partition_and_no_scratch():
    d = decide([5, 100, 255])
    assert (d["route"], d["num_partitions"], d["scratch_bytes"]) == ("GqaDecode", 1, 0)


def test_gqa_scratch_is_counted_and_capped_at_512_mib():
    d = decide([70_000] * 4, cores=1)
    assert d["scratch_bytes"] == 4 * 32 * d["num_partitions"] * (128 + 2) * 4
    # 256 sequences x 128k keys would need > 1 GiB of partials at either size: general path.
    big = decide([131_072] * 256, cores=10)
    assert big["route"] == "Varlen" and "scratch" in big["reason"]


def test_512_partitions_when_256_would_overflow_the_scratch():
    # 256-key partials of 64 x 128k-key sequences need 520 MiB; 512-key ones half that.
    d = decide([131_072] * 64, cores=100_000)
    assert (d["route"], d["partition_size"]) == ("GqaDecode", 512)
    assert d["scratch_bytes"] <= 512 << 20


def test_disabled_gqa_decode_takes_the_general_path():
    d = decide([3000], disabled=True)
    assert d["route"] == "SplitKv" and "VLLM_METAL_DISABLE_GQA_DECODE" in d["reason"]
    assert decide([3000] * 64, disabled=True)["route"] == "Varlen"


@pytest.mark.parametrize("change", [{"shape": SMOLLM}, {"block_size": 64}, {"query_dtype": "float32"}],
                         ids=["geometry", "block_size", "mixed_dtypes"])
def test_unsupported_shapes_fall_back(change):
    d = decide([3000], **change)
    assert d["route"] == "SplitKv"
    assert decide([3000] * 64, **change)["route"] == "Varlen"


def test_prefill_takes_varlen():
    assert decide([512, 700], [512, 200])["route"] == "Varlen"


def test_small_chunk_over_a_long_context_splits():
    # 2 rows x 9 heads = 18 (row, head) pairs under the 330 budget; 4000 keys: 8 partitions of 512.
    d = decide([4000], [2], shape=SMOLLM)
    assert (d["route"], d["partition_size"], d["num_partitions"]) == ("SplitKv", 256, 16)


def test_no_split_when_the_context_fits_one_partition():
    assert decide([256], [2], shape=SMOLLM)["route"] == "Varlen"
    assert decide([257], [2], shape=SMOLLM)["num_partitions"] == 2


def test_nax_prefill_is_never_chosen():
    # The route exists in the table but has no kernel (docs/kernels.md, "NAX prefill").
    for lens, q in (([4096], [4096]), ([128] * 8, [128] * 8)):
        assert decide(lens, q, cores=40)["route"] != "NaxPrefill"


def test_empty_batch_is_varlen():
    assert decide([], [])["route"] == "Varlen"
    assert decide([5, 7], [0, 0])["route"] == "Varlen"


def test_random_shapes_never_fail():
    rng = random.Random(0)
    for _ in range(300):
        kv = rng.choice([1, 2, 3, 4, 8])
        shape = {"num_heads": kv * rng.choice([1, 2, 3, 4, 6, 8]), "num_kv_heads": kv,
                     "head_size": rng.choice([32, 64, 80, 128, 256, 512])}
        n = rng.randint(0, 6)
        q = [rng.choice([0, 1, 1, 5, 300]) for _ in range(n)]
        lens = [qi + rng.randint(0, 70_000) for qi in q]
        d = decide(lens, q, shape=shape, block_size=rng.choice([8, 16, 32, 64, 1]),
                   dtype=rng.choice(["float16", "bfloat16", "float32"]), cores=rng.randint(0, 80),
                   disabled=rng.random() < 0.2)
        assert d["route"] in ("Varlen", "SplitKv", "GqaDecode")
        assert d["scratch_bytes"] <= 512 << 20


def test_bad_arguments_raise_value_errors():
    ops = get_ops()
    with pytest.raises(ValueError, match="same length"):
        ops._paged_dispatch([1, 2], [1], 32, 8, 128, 16, "float16", compute_units=1)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ops._paged_dispatch([1], [1], 30, 8, 128, 16, "float16", compute_units=1)
    with pytest.raises(ValueError, match="dtype must be"):
        ops._paged_dispatch([1], [1], 32, 8, 128, 16, "int8", compute_units=1)


def test_gpu_core_count_has_a_fallback_off_apple():
    # docs/kernels.md: 8 cores when the IORegistry cannot be read (always, off Apple).
    cores = get_ops().gpu_core_count()
    assert cores == 8 if sys.platform != "darwin" else cores >= 1
