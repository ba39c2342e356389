"""What one rank of several on a host takes of it: its cores and its memory.

Tensor-parallel ranks compute at the same time and wait for each other at every
all-sum, so each gets its own cores (a kernel pool per rank over all cores would run
twice the threads the host has, and a rank whose threads are descheduled holds up
the other at the next sum). Pipeline stages take turns, so they keep every core.
Each rank's memory budget is its share of the host's.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_metal")


def ranks_on_host(world_size: int, nnodes: int) -> int:
    """The engine's ranks on this host (vLLM spreads them evenly over its nodes)."""
    return max(1, world_size // max(1, nnodes))


def cores_of(local_rank: int, local_ranks: int, cores: list[int]) -> list[int]:
    """Local rank ``local_rank``'s cores of ``cores`` (sorted ids), in contiguous runs of
    the same length where they divide; with fewer cores than ranks, ranks share them
    round-robin."""
    if local_ranks <= 1:
        return list(cores)
    n = len(cores)
    if n < local_ranks:
        return [cores[local_rank % n]]
    return cores[n * local_rank // local_ranks:n * (local_rank + 1) // local_ranks]


def pin_to_share(local_rank: int, local_ranks: int) -> list[int] | None:
    """Restrict this process (and the threads it starts after, e.g. the CPU kernel pool,
    which sizes itself from the affinity) to its share of the cores it may run on.
    Returns the cores, or None where the OS has no affinity call (macOS)."""
    if local_ranks <= 1 or not hasattr(os, "sched_setaffinity"):
        return None
    mine = cores_of(local_rank, local_ranks, sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, mine)
    logger.info("Rank %d of %d on this host runs on cores %s", local_rank, local_ranks,
                ",".join(map(str, mine)))
    return mine
