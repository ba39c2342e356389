"""CPU time around a level: the server's, the client's and everyone else's share of the machine.

On a shared 2-core machine other jobs depress every figure (a llama-server level ran
20x slower than on a quiet machine); the share they took is recorded next to each
level so a contaminated figure is visible in the table instead of silently wrong.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import psutil

QUIET_BELOW_PCT = 15.0   # machine-wide CPU busy share that counts as idle
QUIET_MAX_WAIT_S = 30.0   # enough for a previous server's teardown; other jobs rarely end sooner


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant, summed over all cores."""

    machine_busy_s: float
    machine_total_s: float
    server_s: float     # the server's process group
    suite_s: float      # this process and its reaped children (the bench client)


def machine_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    t = psutil.cpu_times()
    # Linux counts guest time inside user/nice too; psutil's own busy figure drops it.
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


def group_cpu_s(pgid: int | None) -> float:
    """CPU seconds of every live process in process group `pgid`, with its reaped children."""
    if pgid is None:
        return 0.0
    total = 0.0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except (psutil.Error, OSError):
            continue   # exited between listing and reading
    return total


def suite_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def sample(server_pgid: int | None) -> CpuSample:
    busy, total = machine_times()
    return CpuSample(busy, total, group_cpu_s(server_pgid), suite_cpu_s())


def shares(before: CpuSample, after: CpuSample) -> dict:
    """Percent of the machine's CPU time (all cores = 100) used between two samples by the
    server, by the client (with the suite itself) and by every other process."""
    total = after.machine_total_s - before.machine_total_s
    if total <= 0:
        return {}
    server = max(0.0, after.server_s - before.server_s)
    client = max(0.0, after.suite_s - before.suite_s)
    other = max(0.0, after.machine_busy_s - before.machine_busy_s - server - client)
    return {"server_cpu_pct": round(100 * server / total, 1),
            "client_cpu_pct": round(100 * client / total, 1),
            "other_cpu_pct": round(100 * other / total, 1)}


def wait_until_quiet(busy_below_pct: float = QUIET_BELOW_PCT, window_s: float = 3.0,
                     max_wait_s: float = QUIET_MAX_WAIT_S) -> dict:
    """Wait for a `window_s` window in which the machine is less than `busy_below_pct` busy
    (a previous server's exit, another job), at most `max_wait_s`; returns what was seen."""
    if not 0 < busy_below_pct <= 100:
        raise ValueError(f"busy_below_pct must be in (0, 100], got {busy_below_pct}")
    begin = time.monotonic()
    while True:
        busy = psutil.cpu_percent(interval=window_s)
        waited = time.monotonic() - begin
        if busy < busy_below_pct or waited >= max_wait_s:
            return {"cpu_busy_before_pct": round(busy, 1), "quiet_wait_s": round(waited, 1),
                    "quiet": busy < busy_below_pct}
