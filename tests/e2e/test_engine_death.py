"""`vllm serve` exits with status 1 when its engine process dies (so launchd or systemd
restart it), and as before when stopped by a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.e2e.server import VllmServer
from tests.tiny_models import cached_tiny_model
from vllm_metal.engine_death import EXIT_STATUS

pytestmark = pytest.mark.slow


def _engine_core(server: VllmServer) -> int:
    """The pid of the server's engine core process (a child of the API server)."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(server.proc.pid)],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "EngineCore" in args or "engine" in args.lower():
            return int(pid)
    raise AssertionError(f"no engine core among the server's children:\n{out}")


def _wait_exit(server: VllmServer, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.proc.poll() is not None, "the server outlived its engine:\n" + server.output()
    return server.proc.returncode


def test_server_exits_with_failure_when_its_engine_is_killed():
    server = VllmServer(str(cached_tiny_model("llama")), "--max-model-len", "256")
    try:
        os.kill(_engine_core(server), signal.SIGKILL)
        assert _wait_exit(server) == EXIT_STATUS, server.output()
        assert "The engine died" in server.output()
    finally:
        server.stop()


def test_server_stopped_by_a_signal_exits_as_before():
    server = VllmServer(str(cached_tiny_model("llama")), "--max-model-len", "256")
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
        assert _wait_exit(server) != EXIT_STATUS, server.output()
    finally:
        server.stop()
