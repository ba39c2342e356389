"""How much memory the KV cache gets under --gpu-memory-utilization."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("vllm_metal")
GiB = 2**30


# MLX's own cache limit on its CPU backend: room for a decode step's buffers.
MIN_ALLOCATOR_CACHE = 32 << 20


class InsufficientMemoryError(RuntimeError):
    pass


@dataclass(frozen=True)
class ActivationEstimate:
    """Peak transient bytes of a max_num_batched_tokens forward."""

    arrays: int          # MLX arrays (what MLX's allocator and its cache hold)
    kernel_scratch: int  # the CPU kernels' own buffers (malloc), MLX-invisible

    @property
    def total(self) -> int:
        return self.arrays + self.kernel_scratch


def allocator_cache_limit(array_activations: int) -> int:
    """Bytes MLX may keep of freed buffers, from the MLX-array part of a step's peak
    activations: that is all the next step can reuse; MLX's Metal default (its memory
    limit, most of the machine) would let buffers of shapes never seen again hold memory
    the budget gave the KV cache."""
    return max(array_activations, MIN_ALLOCATOR_CACHE)


@dataclass(frozen=True)
class MemoryBudget:
    """All sizes in bytes.

    device_total:  the device's memory (Metal working set, or system RAM on Linux)
    utilization:   --gpu-memory-utilization
    weights:       model parameters
    activations:   peak transient memory of a max_num_batched_tokens forward
    allocator_cache: the most freed memory MLX keeps for reuse (its cache limit),
                   which can sit beside a step's live activations
    """

    device_total: int
    utilization: float
    weights: int
    activations: int
    allocator_cache: int = 0

    @property
    def budget(self) -> int:
        return int(self.device_total * self.utilization)

    @property
    def available_for_kv(self) -> int:
        return self.budget - self.weights - self.activations - self.allocator_cache

    def kv_cache_bytes(self, bytes_per_block: int, block_size: int, max_model_len: int,
                       max_num_seqs: int, cap: int | None = None,
                       one_request: int | None = None) -> int:
        """KV bytes to allocate: what the budget leaves, capped at what the scheduler can use
        and at ``cap`` (raised to one max-length request if smaller).

        ``one_request``: the bytes one max-length request holds, when not every layer
        keeps a block per ``block_size`` tokens (a hybrid's recurrent layers keep one
        state); default max_model_len / block_size blocks of ``bytes_per_block``.
        Raises InsufficientMemoryError when one max-length request does not fit.
        """
        if one_request is None:
            one_request = -(-max_model_len // block_size) * bytes_per_block
        available = self.available_for_kv
        if available < one_request:
            raise InsufficientMemoryError(
                f"Not enough memory for the KV cache of one {max_model_len}-token request: "
                f"budget {self.budget / GiB:.2f} GiB (--gpu-memory-utilization "
                f"{self.utilization} of {self.device_total / GiB:.2f} GiB) minus weights "
                f"{self.weights / GiB:.2f} GiB, activations {self.activations / GiB:.2f} GiB "
                f"and allocator cache {self.allocator_cache / GiB:.2f} GiB leaves "
                f"{available / GiB:.3f} GiB, but one request needs {one_request / GiB:.3f} "
                f"GiB. Raise --gpu-memory-utilization or lower --max-model-len (or "
                f"--max-num-batched-tokens).")
        # More blocks than max_num_seqs full-length requests can never be used at
        # once; keeping them from other applications helps nobody.
        useful = one_request * max_num_seqs + bytes_per_block
        kv = min(available, useful)
        if cap is not None:
            kv = min(kv, max(cap, one_request + bytes_per_block))
        return kv
