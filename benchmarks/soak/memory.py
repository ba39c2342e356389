"""Resident memory of a server's process tree, and the trend of a series of samples."""

from __future__ import annotations

import re

import numpy as np
import psutil

MiB = 2**20
MAX_SLOPE_MIB_PER_MIN = 2.0


def tree_rss(pid: int) -> dict[str, int]:
    """RSS in bytes of the server (``api``), its largest child (``engine``: vLLM's engine
    core) and of the whole tree (``total``)."""
    root = psutil.Process(pid)
    children = root.children(recursive=True)
    rss = {p.pid: _rss(p) for p in [root, *children]}
    engine = max((rss[c.pid] for c in children), default=0)
    return {"api": rss[root.pid], "engine": engine, "total": sum(rss.values())}


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:  # a helper process that exited between listing and reading
        return 0


def slope_mib_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, bytes) points, in MiB per minute."""
    if len({t for t, _ in points}) < 2:
        return 0.0
    t, b = np.array(points, dtype=np.float64).T
    return float(np.polyfit(t, b, 1)[0]) * 60 / MiB


def target_met(summary: dict) -> bool:
    """The soak's target: flat after warm-up, the peak inside the budget."""
    return (summary["engine_slope_mib_per_min"] < MAX_SLOPE_MIB_PER_MIN
            and summary["peak_within_budget"])


def budget_from_log(text: str) -> dict[str, float]:
    """The engine's memory budget line (GiB figures) from a server log, or {}."""
    m = re.search(r"Memory budget ([\d.]+) GiB: weights ([\d.]+) GiB, activations ([\d.]+) GiB, "
                  r"allocator cache ([\d.]+) GiB, KV cache ([\d.]+) GiB", text)
    if not m:
        return {}
    keys = ("budget", "weights", "activations", "allocator_cache", "kv_cache")
    return {k: float(v) for k, v in zip(keys, m.groups())}
