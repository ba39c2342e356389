"""The failing server's exit path leaves none of its processes running: descendants
still alive after the grace period are killed (a child ignoring SIGTERM, a grandchild
orphaned from it), while multiprocessing's resource tracker is spared to clean up.

Runs in a throwaway process: reaping in pytest's own process would kill whatever else
the test session started."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.e2e.server import running

SCRIPT = r"""
import json, subprocess, sys, time
import psutil
from vllm_metal import engine_death

stubborn = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
            "time.sleep(120)")
# Not on our pipes: a survivor would hold the test's read of this script's output open.
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
child = subprocess.Popen([sys.executable, "-c", stubborn], **quiet)
spared = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                           "resource_tracker"], **quiet)
deadline = time.monotonic() + 30
while len(psutil.Process(child.pid).children()) < 1 and time.monotonic() < deadline:
    time.sleep(0.05)
grandchild = psutil.Process(child.pid).children()[0].pid
start = time.monotonic()
engine_death._reap_descendants(0.5)
print(json.dumps({"pids": [child.pid, grandchild], "spared": spared.pid,
                  "seconds": time.monotonic() - start}))
spared.kill()
"""


def test_descendants_left_after_the_grace_period_are_killed():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in report["pids"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in report["pids"] if running(pid)]
    # The grace period was waited out (the stubborn child ignored it), not skipped.
    assert 0.5 <= report["seconds"] < 10
    assert "outlived the engine; killing it" in out.stderr


def test_the_resource_tracker_is_spared():
    script = SCRIPT.replace("spared.kill()", "print(psutil.pid_exists(spared.pid) and "
                            "psutil.Process(spared.pid).status() != 'zombie'); spared.kill()")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True"
