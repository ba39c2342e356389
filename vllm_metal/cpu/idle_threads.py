"""Keep torch.distributed's idle transport threads off the compute cores.

vLLM's code paths consult process groups even for one process, so the worker
creates them; each gloo group starts a TCP loop thread that wakes every 10 ms
with nothing to do. A dozen of them wake ~1,300 times a second, and on a
2-core host each wake-up preempts one of the two kernel threads mid-item,
stalling the other at the next join. SCHED_IDLE lets them run only on an
otherwise idle core; with one process they carry no traffic.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm_metal")

GLOO_LOOP_THREAD = "gloo_tcp_loop"


def deprioritize_threads(name: str = GLOO_LOOP_THREAD) -> int:
    """Move this process's threads called ``name`` to SCHED_IDLE. Returns how many moved.

    Linux only (elsewhere, and where /proc is unreadable, it does nothing).
    """
    if not hasattr(os, "SCHED_IDLE"):
        return 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    moved = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
            moved += 1
        except (OSError, ValueError):
            continue  # the thread exited meanwhile, or the policy is not allowed
    logger.debug("moved %d %s threads to SCHED_IDLE", moved, name)
    return moved
