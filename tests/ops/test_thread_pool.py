"""The CPU kernel pool's join: a caller that outlasts its spin blocks, and the last
worker out wakes it.

Run in a child process with a timeout, so a lost wake-up fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_metal.native import get_ops

CHILD = r"""
import random
from vllm_metal.native import get_ops

ext = get_ops()
ext.debug.pool_run([0, 0])   # the pool's threads start
rng = random.Random(0)
blocked = 0
for _ in range(300):
    # Sleeps around the spin (30 us) and well past it, in random order, so
    # each side of the join is sometimes the slow one.
    delays = [rng.choice([0, 0, 20, 60, 500, 2000]) for _ in range(rng.randint(1, 9))]
    runs, b = ext.debug.pool_run(delays)
    assert runs == [1] * len(delays), (delays, runs)
    blocked += b
# The caller takes item 0 first; the worker, woken meanwhile, takes item 1 and
# outlasts the caller's item by 4 ms.
slow_second = sum(ext.debug.pool_run([1000, 5000])[1] for _ in range(20))
print(blocked, slow_second)
"""


def run_child(code: str) -> str:
    """stdout of `code` run by a fresh interpreter with the default pool size."""
    env = dict(os.environ)
    env.pop("VLLM_METAL_CPU_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(get_ops().cpu_threads() < 2, reason="a join needs a worker thread")
def test_blocked_joins_run_every_item_once_and_wake():
    blocked, slow_second = map(int, run_child(CHILD).split())
    assert slow_second >= 10   # most of 20 joins that waited 4 ms blocked
    assert blocked > 0


FORK_CHILD = r"""
import os, time
from vllm_metal.native import get_ops

ext = get_ops()
ext.debug.pool_run([0, 0])   # the parent's pool and its threads exist before the fork
pid = os.fork()
if pid == 0:
    # The child inherits the pool object but not its threads: it must build its own,
    # or its two 50 ms items would run one after the other on the caller.
    start = time.perf_counter()
    runs, _ = ext.debug.pool_run([50_000, 50_000])
    os._exit(0 if runs == [1, 1] and time.perf_counter() - start < 0.09 else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(get_ops().cpu_threads() < 2, reason="needs a worker thread")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_pool_with_threads():
    assert run_child(FORK_CHILD).split()[-1] == "0"
