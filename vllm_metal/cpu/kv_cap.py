"""The CPU backend's KV cache cap: host RAM is shared with everything else."""

from __future__ import annotations

from vllm_metal import envs

# Left for the API server, the client and the OS.
HOST_RESERVE = 2 * 2**30


def kv_cache_cap() -> int | None:
    """VLLM_METAL_CPU_KV_CACHE_GIB, and never more than the host can spare (MemAvailable
    less HOST_RESERVE). The worker skips the cap when --kv-cache-memory sizes the cache."""
    cap = int(envs.VLLM_METAL_CPU_KV_CACHE_GIB * 2**30)
    available = available_host_memory()
    if available is not None:
        cap = min(cap, max(available - HOST_RESERVE, 0))
    return cap


def available_host_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
