"""What one rank of several on a host takes of it: its cores and its memory.

The ranks on a host are its data-parallel engines' ranks (each engine's tensor or
pipeline ranks). Data-parallel engines and tensor-parallel ranks compute at the same
time (tensor ranks wait for each other at every all-sum), so each gets its own cores:
a kernel pool per rank over all cores would run several times the threads the host
has, and a tensor rank whose threads are descheduled holds up the others at the next
sum. Pipeline stages take turns, so they keep every core. Each rank's memory budget
is its share of the host's.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_metal")


# additional_config's key for the number of data-parallel engines on this host.
_ENGINES = "vllm_metal_engines_on_host"


def remember_engines(vllm_config) -> None:
    """Keep the data-parallel engines on this host in the config: vLLM gives each dense
    model's engine a config of data-parallel size 1 before its workers start."""
    parallel = vllm_config.parallel_config
    if parallel.data_parallel_size > 1:
        vllm_config.additional_config.setdefault(_ENGINES, parallel.data_parallel_size_local)


def host_share(vllm_config, local_rank: int) -> tuple[int, int]:
    """(this rank's index among the ranks on this host, how many there are): each
    data-parallel engine's ranks in turn, vLLM spreading an engine's ranks evenly
    over its nodes."""
    parallel = vllm_config.parallel_config
    per_engine = max(1, parallel.world_size // max(1, parallel.nnodes))
    engines = int(vllm_config.additional_config.get(_ENGINES, 1))
    engine = parallel.data_parallel_rank_local or 0
    return engine * per_engine + local_rank, engines * per_engine


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
