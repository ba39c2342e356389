"""deprioritize_threads: threads with the given name go to SCHED_IDLE, others stay."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import pytest

from vllm_metal.cpu.idle_threads import deprioritize_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling")

PR_SET_NAME = 15


def _named_thread(name: str, ready: threading.Event, stop: threading.Event, tids: list):
    def run():
        # The kernel's thread name (/proc/.../comm), which Python's thread name is not.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
        tids.append(threading.get_native_id())
        ready.set()
        stop.wait()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_only_named_threads_move_to_sched_idle():
    stop, tids, threads = threading.Event(), [], []
    for name in ("vm_test_loop", "vm_test_loop", "vm_test_other"):
        ready = threading.Event()
        threads.append(_named_thread(name, ready, stop, tids))
        ready.wait(5)
    try:
        assert deprioritize_threads("vm_test_loop") == 2
        policies = [os.sched_getscheduler(t) for t in tids]
        assert policies == [os.SCHED_IDLE, os.SCHED_IDLE, os.SCHED_OTHER]
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller is untouched
        assert deprioritize_threads("no_such_thread_name") == 0
    finally:
        stop.set()
        for t in threads:
            t.join(5)
