"""Start ``vllm serve`` on 127.0.0.1 for tests and stop it afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                           text=True).stdout.strip()
    return state not in ("", "Z")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """``command`` (default: this venv's ``vllm serve MODEL``) with ARGS, host and port;
    ``env`` replaces the environment, ``cwd`` the working directory."""

    def __init__(self, model: str | None, *args: str, timeout: float = 240.0,
                 command: list[str] | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        if command is None:
            command = [str(Path(sys.executable).with_name("vllm")), "serve"]
        env = dict(os.environ if env is None else env)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the real, default process layout
        logs = Path(os.environ.get("TMPDIR", "/tmp"))
        self.log = open(logs / f"vllm-serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [*command, *([model] if model else []), "--host", "127.0.0.1", "--port",
             str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if requests.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        """The log's last 8000 characters (for failure messages)."""
        return self.full_output()[-8000:]

    def full_output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()
