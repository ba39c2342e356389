import pytest

from vllm_metal.v1.memory_budget import (MIN_ALLOCATOR_CACHE, InsufficientMemoryError,
                                        MemoryBudget, allocator_cache_limit)

GiB = 2**30


def test_kv_gets_what_weights_and_activations_leave_capped_at_useful():
    budget = MemoryBudget(device_total=16 * GiB, utilization=0.5, weights=2 * GiB,
                          activations=1 * GiB)
    assert budget.available_for_kv == 5 * GiB
    block = 1 << 20  # 1 MiB per 16-token block
    # 4 seqs x 4096 tokens = 1024 blocks = 1 GiB (+1 block): the cap binds.
    assert budget.kv_cache_bytes(block, 16, 4096, 4) == 1024 * block + block
    # 64 seqs would use 16 GiB: the budget binds.
    assert budget.kv_cache_bytes(block, 16, 4096, 64) == 5 * GiB


def test_one_request_that_does_not_fit_is_refused_with_numbers_and_flags():
    budget = MemoryBudget(device_total=8 * GiB, utilization=0.3, weights=2 * GiB, activations=0)
    with pytest.raises(InsufficientMemoryError) as info:
        budget.kv_cache_bytes(1 << 20, 16, 1_000_000, 1)
    message = str(info.value)
    assert "--gpu-memory-utilization" in message and "--max-model-len" in message
    assert "2.40 GiB" in message  # the budget


def test_a_hybrids_request_is_its_attention_blocks_and_one_state():
    budget = MemoryBudget(device_total=8 * GiB, utilization=0.5, weights=0, activations=0)
    block = 1 << 20
    # 4 GiB do not hold 8192 blocks of every layer, but do hold what a hybrid request
    # keeps: here a quarter of the layers attend, the rest keep one state block each.
    with pytest.raises(InsufficientMemoryError):
        budget.kv_cache_bytes(block, 16, 131072, 1)
    one = 8192 * block // 4 + 24
    assert budget.kv_cache_bytes(block, 16, 131072, 1, one_request=one) == one + block


def test_cap_limits_kv_but_never_below_one_request():
    budget = MemoryBudget(device_total=16 * GiB, utilization=0.9, weights=0, activations=0)
    block = 1 << 20
    assert budget.kv_cache_bytes(block, 16, 4096, 64, cap=2 * GiB) == 2 * GiB
    # One 4096-token request needs 256 blocks = 256 MiB: a smaller cap is raised to it.
    assert budget.kv_cache_bytes(block, 16, 4096, 64, cap=1 << 20) == 257 * block


def test_allocator_cache_is_taken_from_the_kv_share_and_named_in_the_refusal():
    budget = MemoryBudget(device_total=16 * GiB, utilization=0.5, weights=2 * GiB,
                          activations=1 * GiB, allocator_cache=1 * GiB)
    assert budget.available_for_kv == 4 * GiB
    block = 1 << 20
    assert budget.kv_cache_bytes(block, 16, 4096, 64) == 4 * GiB
    tight = MemoryBudget(device_total=4 * GiB, utilization=0.5, weights=1 * GiB,
                         activations=0, allocator_cache=1 * GiB)
    with pytest.raises(InsufficientMemoryError, match="allocator cache 1.00 GiB"):
        tight.kv_cache_bytes(block, 16, 4096, 1)


def test_allocator_cache_limit_is_the_arrays_share_with_mlx_cpu_default_as_floor():
    assert allocator_cache_limit(3 * GiB) == 3 * GiB
    assert allocator_cache_limit(0) == MIN_ALLOCATOR_CACHE == 32 << 20
