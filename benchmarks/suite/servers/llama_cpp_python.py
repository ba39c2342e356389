"""llama-cpp-python's OpenAI server (builds llama.cpp from source at install, ~8 min on 2 cores)."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.suite.ggml_flags import ggml_cpu_options
from benchmarks.suite.install import ensure_venv
from benchmarks.suite.servers.base import Launch, ModelFiles, Server

PACKAGE = "llama-cpp-python[server]==0.3.36"
LAUNCHER = Path(__file__).with_name("llama_cpp_python_launch.py")


class LlamaCppPython(Server):
    name = "llama-cpp-python"
    label = ("llama.cpp via llama-cpp-python 0.3.36 (one model behind a lock: no batching, "
             "the same GGUF)")

    def install(self) -> None:
        env = {**os.environ, "CMAKE_ARGS": " ".join(ggml_cpu_options()),
               "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
        ensure_venv(self.root / "venv", [PACKAGE], self.log, env=env)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        python = self.root / "venv" / "bin" / "python"
        argv = [str(python), str(LAUNCHER), "--model", str(models.gguf), "--host", "127.0.0.1",
                "--port", str(port), "--n_threads", "2", "--n_threads_batch", "2",
                "--n_ctx", "2048",
                # Default True cancels a running stream whenever another request arrives.
                "--interrupt_requests", "False"]
        return Launch(argv=argv, model_name=models.gguf.stem, health_path="/v1/models")
