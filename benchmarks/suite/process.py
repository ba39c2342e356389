"""Run one server at a time in its own process group on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import requests

from benchmarks.suite.servers.base import Launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; carries the tail of its log."""


class ServerProcess:
    """A started server: `start()` waits for health, `stop()` ends its whole process group."""

    def __init__(self, launch: Launch, port: int, log: Path) -> None:
        self.launch = launch
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> float:
        """Start and wait until healthy; returns the startup time in seconds."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.launch.env}
        begin = time.monotonic()
        with open(self.log_path, "w") as log:
            log.write("$ " + " ".join(self.launch.argv) + "\n")
            log.flush()
            self.proc = subprocess.Popen(self.launch.argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, cwd=self.launch.cwd, start_new_session=True)
        while time.monotonic() - begin < timeout:
            if self.proc.poll() is not None:
                raise ServerStartError(f"exited with {self.proc.returncode} during startup:\n"
                                       + self.log_tail())
            try:
                if requests.get(self.base_url + self.launch.health_path, timeout=2).ok:
                    return time.monotonic() - begin
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerStartError(f"not healthy after {timeout:.0f}s:\n" + self.log_tail())

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            self._reap_group()
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        self._reap_group()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _reap_group(self, wait: float = 15.0) -> None:
        # Workers (vLLM's engine core, servers' children) may outlive the leader: kill the
        # rest and wait until they are gone, so the next server starts on an idle machine.
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        deadline = time.monotonic() + wait
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group `pgid`."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return out
