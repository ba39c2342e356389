"""The dispatch decision table (csrc/dispatch/paged_dispatch.cpp), one rule per test.

The decision is a pure function of the shapes, dtypes, lengths, compute units
and environment, exposed as get_ops().debug.paged_dispatch; docs/kernels.md lists
the same rules.
"""

from __future__ import annotations

import random
import sys

import pytest

from vllm_metal.native import get_ops

LLAMA = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128}  # a GQA decode geometry
SMOLLM = {"num_heads": 9, "num_kv_heads": 3, "head_size": 64}   # no GQA decode kernel
BUDGET_PER_CORE = 33


def decide(seq_lens, query_lens=None, *, shape=LLAMA, block_size=16, dtype="float16", query_dtype=None,
           cores=10, disabled=False, nax=False, nax_disabled=False, kv_quant=0):
    return get_ops().debug.paged_dispatch(
        seq_lens, query_lens if query_lens is not None else [1] * len(seq_lens), shape["num_heads"],
        shape["num_kv_heads"], shape["head_size"], block_size, dtype, query_dtype=query_dtype,
        compute_units=cores, gqa_decode_disabled=disabled, nax_available=nax,
        nax_disabled=nax_disabled, kv_quant=kv_quant)


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


def test_nax_prefill_only_where_the_gpu_has_tensor_units():
    # Without them (every GPU before M5, the CPU backend) the route is never taken.
    for lens, q in (([4096], [4096]), ([128] * 8, [128] * 8)):
        assert decide(lens, q, cores=40)["route"] != "NaxPrefill"
        d = decide(lens, q, cores=40, nax=True)
        assert d["route"] == "NaxPrefill" and d["reason"].startswith("NAX prefill: ")
        assert (d["partition_size"], d["num_partitions"], d["scratch_bytes"]) == (None, 1, 0)


def test_nax_prefill_tiles_each_sequence():
    d = decide([100, 300, 64], [100, 70, 64], nax=True)
    assert d["reason"] == "NAX prefill: 5 tile(s) of 64 rows"   # 2 + 2 + 1


@pytest.mark.parametrize("why,kwargs,reason", [
    ("disabled", dict(nax_disabled=True), "VLLM_METAL_DISABLE_NAX_PREFILL"),
    ("head size", dict(shape=SMOLLM | {"head_size": 80}), "head size 80"),
    ("float32", dict(dtype="float32"), "float16 or bfloat16"),
    ("query dtype", dict(query_dtype="bfloat16"), "float16 or bfloat16"),
    ("quantized cache", dict(kv_quant=2), "float caches"),
    ("block size", dict(block_size=12), "block size 12"),
])
def test_nax_prefill_refusals_name_their_reason(why, kwargs, reason):
    d = decide([512], [512], nax=True, **kwargs)
    assert d["route"] != "NaxPrefill" and reason in d["reason"], why


def test_nax_prefill_is_for_prefill_dominated_batches():
    assert decide([4000] * 8, [1] * 8, nax=True)["route"] == "GqaDecode"      # decode
    assert decide([10], [10], nax=True)["route"] != "NaxPrefill"              # < 16 rows
    mixed = decide([64, 900, 900, 900], [64, 30, 30, 30], nax=True)            # 64 of 154
    assert mixed["route"] != "NaxPrefill" and "not prefill-dominated" in mixed["reason"]
    assert decide([100, 900], [100, 30], nax=True)["route"] == "NaxPrefill"  # 100 of 130


def test_nax_prefill_can_be_disabled_by_environment(monkeypatch):
    ops = get_ops()
    assert ops.debug.nax_prefill_disabled() is False
    monkeypatch.setenv("VLLM_METAL_DISABLE_NAX_PREFILL", "1")
    assert ops.debug.nax_prefill_disabled() is True
    monkeypatch.setenv("VLLM_METAL_DISABLE_NAX_PREFILL", "maybe")
    with pytest.raises(ValueError, match="VLLM_METAL_DISABLE_NAX_PREFILL"):
        ops.debug.nax_prefill_disabled()


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
        ops.debug.paged_dispatch([1, 2], [1], 32, 8, 128, 16, "float16", compute_units=1)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ops.debug.paged_dispatch([1], [1], 30, 8, 128, 16, "float16", compute_units=1)
    with pytest.raises(ValueError, match="dtype must be"):
        ops.debug.paged_dispatch([1], [1], 32, 8, 128, 16, "int8", compute_units=1)


def test_gpu_core_count_has_a_fallback_off_apple():
    # docs/kernels.md: 8 cores when the IORegistry cannot be read (always, off Apple).
    cores = get_ops().gpu_core_count()
    assert cores == 8 if sys.platform != "darwin" else cores >= 1


# The CPU backend's decision (decide_cpu_paged_dispatch, docs/gqa-decode.md "The CPU
# counterpart"): its own GqaDecode admission and partitions; everything else as above.
CPU_PIECES_PER_THREAD = 2  # kCpuPiecesPerThread
CPU_MIN_PIECE = 64  # kCpuMinPiece


def cpu_decide(seq_lens, query_lens=None, *, shape=SMOLLM, block_size=16, dtype="float32", query_dtype=None,
               threads=2, disabled=False, sliding_window=0):
    return get_ops().debug.cpu_paged_dispatch(
        seq_lens, query_lens if query_lens is not None else [1] * len(seq_lens), shape["num_heads"],
        shape["num_kv_heads"], shape["head_size"], block_size, dtype, query_dtype=query_dtype,
        threads=threads, gqa_decode_disabled=disabled, sliding_window=sliding_window)


def cpu_partition(spans, threads):
    """The documented rule: about 1 / (2 x threads) of all keys per piece, at least 64."""
    longest = max(spans + [1])
    if threads <= 1:
        return longest
    share = -(-sum(spans) // (threads * CPU_PIECES_PER_THREAD))
    return min(max(share, CPU_MIN_PIECE), max(longest, CPU_MIN_PIECE))


@pytest.mark.parametrize("shape", [SMOLLM, LLAMA, {"num_heads": 4, "num_kv_heads": 4, "head_size": 64},
                                   {"num_heads": 8, "num_kv_heads": 1, "head_size": 80}],
                         ids=["smollm", "llama", "mha", "mqa-d80"])
@pytest.mark.parametrize("block_size", [16, 5])
def test_cpu_takes_gqa_decode_for_every_geometry_and_block_size(shape, block_size):
    d = cpu_decide([700, 20], shape=shape, block_size=block_size, dtype="bfloat16", query_dtype="float32")
    assert d["route"] == "GqaDecode"


def test_cpu_decision_leaves_the_metal_decision_alone():
    # SmolLM2's geometry has no Metal GQA kernel: Metal still splits or goes varlen.
    assert decide([300], shape=SMOLLM, cores=2)["route"] == "SplitKv"
    assert decide([300] * 16, shape=SMOLLM, cores=2)["route"] == "Varlen"
    assert cpu_decide([300], threads=2)["route"] == "GqaDecode"
    assert cpu_decide([300] * 16, threads=2)["route"] == "GqaDecode"


@pytest.mark.parametrize("seq_lens,threads", [([300], 2), ([2000], 2), ([8000], 4), ([300] * 3, 2),
                                              ([8000, 300, 300], 2), ([40], 2), ([100], 2)])
def test_cpu_partitions_share_the_keys_evenly(seq_lens, threads):
    d = cpu_decide(seq_lens, threads=threads)
    assert d["partition_size"] == cpu_partition(seq_lens, threads)
    assert d["num_partitions"] == max(-(-n // d["partition_size"]) for n in seq_lens)


def test_cpu_single_sequence_is_cut_into_two_pieces_per_thread():
    for threads in (2, 3, 4):
        assert cpu_decide([4000], threads=threads)["num_partitions"] == CPU_PIECES_PER_THREAD * threads


def test_cpu_many_sequences_are_not_split():
    d = cpu_decide([300] * 16, threads=2)
    assert d["num_partitions"] == 1 and d["scratch_bytes"] == 0


def test_cpu_one_thread_never_splits():
    d = cpu_decide([9000, 5], threads=1)
    assert d["num_partitions"] == 1 and d["partition_size"] == 9000


def test_cpu_scratch_counts_the_pieces_of_split_sequences():
    d = cpu_decide([2000, 30], threads=2)  # 2000 -> 4 pieces; 30 stays whole
    assert d["num_partitions"] == 4
    assert d["scratch_bytes"] == 4 * SMOLLM["num_heads"] * (SMOLLM["head_size"] + 2) * 4


def test_cpu_sliding_window_limits_the_keys_to_share():
    d = cpu_decide([8000], threads=2, sliding_window=1000)
    assert d["partition_size"] == cpu_partition([1000], 2)
    assert d["num_partitions"] == -(-1000 // d["partition_size"])  # pieces cut the window only


@pytest.mark.parametrize("seq_lens,query_lens", [([400, 300], [400, 300]), ([3000], [17]),
                                                 ([300, 900], [1, 40])])
def test_cpu_prefill_and_mixed_batches_follow_the_general_rules(seq_lens, query_lens):
    cpu = cpu_decide(seq_lens, query_lens, threads=2)
    metal = decide(seq_lens, query_lens, shape=SMOLLM, dtype="float32", cores=2)
    assert cpu == metal


CPU_SHORT_QUERY_ROWS = 16  # kCpuShortQueryRows


@pytest.mark.parametrize("seq_lens,query_lens,threads", [([3000], [4], 2), ([2000, 600], [4, 4], 2),
                                                         ([8000], [16], 4), ([600] * 8, [4] * 8, 2),
                                                         ([900, 300], [1, 4], 2), ([40], [2], 2)])
def test_cpu_short_queries_share_the_keys_as_decode_does(seq_lens, query_lens, threads):
    # One speculative verification (4 rows) over 3000 keys: the general rule counts
    # 4 x 9 (row, head) pairs against a GPU and splits by 512; the CPU cuts the
    # keys into two pieces per thread, as for a decode row.
    d = cpu_decide(seq_lens, query_lens, threads=threads)
    partition = cpu_partition(seq_lens, threads)
    parts = max(-(-n // partition) for n in seq_lens)
    if parts < 2:
        assert (d["route"], d["num_partitions"]) == ("Varlen", 1) and "short queries" in d["reason"]
    else:
        assert (d["route"], d["partition_size"], d["num_partitions"]) == ("SplitKv", partition, parts)
        assert d["scratch_bytes"] == sum(query_lens) * SMOLLM["num_heads"] * parts * (
            SMOLLM["head_size"] + 2) * 4


def test_cpu_short_queries_end_at_the_decode_kernels_rows():
    assert cpu_decide([3000], [CPU_SHORT_QUERY_ROWS])["reason"].startswith("CPU short queries")
    longer = cpu_decide([3000], [CPU_SHORT_QUERY_ROWS + 1])
    assert longer == decide([3000], [CPU_SHORT_QUERY_ROWS + 1], shape=SMOLLM, dtype="float32", cores=2)


def test_cpu_short_queries_on_one_thread_are_not_split():
    assert cpu_decide([9000], [4], threads=1)["route"] == "Varlen"


def test_cpu_disabled_gqa_decode_takes_the_general_path():
    cpu = cpu_decide([3000], threads=2, disabled=True)
    metal = decide([3000], shape=SMOLLM, dtype="float32", cores=2, disabled=True)
    assert (cpu["route"], cpu["partition_size"], cpu["num_partitions"]) == (
        metal["route"], metal["partition_size"], metal["num_partitions"])
    assert cpu["route"] == "SplitKv" and "disabled" in cpu["reason"]


def test_cpu_random_shapes_never_fail():
    rng = random.Random(1)
    for _ in range(300):
        kv = rng.choice([1, 2, 3, 8])
        shape = {"num_heads": kv * rng.choice([1, 3, 4, 8]), "num_kv_heads": kv,
                 "head_size": rng.choice([32, 64, 80, 128])}
        n = rng.randint(0, 6)
        q = [rng.choice([1, 1, 1, 5]) for _ in range(n)]
        lens = [qi + rng.randint(0, 70_000) for qi in q]
        d = cpu_decide(lens, q, shape=shape, threads=rng.randint(1, 64), disabled=rng.random() < 0.2,
                       sliding_window=rng.choice([0, 0, 100, 5000]))
        assert d["route"] in ("Varlen", "SplitKv", "GqaDecode")
        if d["route"] == "GqaDecode":
            assert d["partition_size"] >= 1 and d["num_partitions"] >= 1


def test_cpu_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="threads must be >= 1"):
        cpu_decide([10], threads=0)
    with pytest.raises(ValueError, match="sliding_window must be >= 0"):
        cpu_decide([10], sliding_window=-1)
    with pytest.raises(ValueError, match="same length"):
        cpu_decide([10, 2], [1])
